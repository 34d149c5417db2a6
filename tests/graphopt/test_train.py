import json

import numpy as np
import pytest

from timerl.errors import CheckpointError, GraphError
from timerl.graphopt.policy import PolicyWeights
from timerl.graphopt.random_graph import random_graph

pytest.importorskip("torch")

from timerl.graphopt.train import TrainConfig, train  # noqa: E402


@pytest.fixture
def tiny_corpus(tmp_path):
    root = tmp_path / "corpus"
    entries = []
    for k in range(3):
        g = random_graph(20 + 10 * k, seed=k, view_prob=0.2)
        rel = f"train/rand/g{k}.json"
        (root / "train" / "rand").mkdir(parents=True, exist_ok=True)
        g.save(root / rel)
        entries.append(
            {
                "name": f"g{k}",
                "family": "rand",
                "kind": "synthetic",
                "split": "train",
                "nodes": g.n,
                "path": rel,
            }
        )
    (root / "index.json").write_text(json.dumps({"graphs": entries}))
    return root


def _config(corpus, **kw):
    base = dict(
        corpus=str(corpus),
        budget=40,
        batch=2,
        hidden=8,
        rounds=1,
        replay_batch=2,
        runtime_max_nodes=30,
    )
    base.update(kw)
    return TrainConfig(**base)


def test_train_writes_loadable_weights_and_learns_something(tiny_corpus, tmp_path):
    out = tmp_path / "p.npz"
    lines = []
    w = train(_config(tiny_corpus), iterations=3, out=out, log=lines.append)
    back = PolicyWeights.load(out)
    assert back.meta["trained"] is True and back.meta["iterations"] == 3
    untrained = PolicyWeights.random(8, 1, seed=0)
    # the updates changed the parameters
    assert any(not np.array_equal(back.params[k], untrained.params[k]) for k in back.params)
    assert all(np.array_equal(back.params[k], w.params[k]) for k in back.params)
    assert any("training problems" in line for line in lines)
    # both objectives among the problems (graphs of 20 and 30 nodes also get a runtime one)
    assert "5 training problems" in lines[0]


def test_resume_continues_exactly(tiny_corpus, tmp_path):
    cfg = _config(tiny_corpus)
    straight = train(cfg, iterations=4, out=tmp_path / "a.npz", log=lambda s: None)
    ckpt = tmp_path / "b.ckpt.npz"
    train(cfg, iterations=2, out=tmp_path / "b.npz", checkpoint=ckpt, log=lambda s: None)
    resumed = train(
        cfg,
        iterations=4,
        out=tmp_path / "b.npz",
        checkpoint=ckpt,
        resume=True,
        log=lambda s: None,
    )
    assert PolicyWeights.load(tmp_path / "b.npz").meta["iterations"] == 4
    for k in straight.params:
        assert np.allclose(straight.params[k], resumed.params[k], atol=1e-6), k


def test_resume_with_other_settings_is_refused(tiny_corpus, tmp_path):
    ckpt = tmp_path / "c.ckpt.npz"
    train(
        _config(tiny_corpus),
        iterations=1,
        out=tmp_path / "c.npz",
        checkpoint=ckpt,
        log=lambda s: None,
    )
    with pytest.raises(CheckpointError, match="budget=40.*budget=50"):
        train(
            _config(tiny_corpus, budget=50),
            iterations=2,
            out=tmp_path / "c.npz",
            checkpoint=ckpt,
            resume=True,
            log=lambda s: None,
        )


def test_resume_without_checkpoint_names_it(tiny_corpus, tmp_path):
    with pytest.raises(CheckpointError, match="missing.npz: file not found"):
        train(
            _config(tiny_corpus),
            iterations=1,
            out=tmp_path / "x.npz",
            checkpoint=tmp_path / "missing.npz",
            resume=True,
            log=lambda s: None,
        )


def test_no_training_graphs_is_an_error(tiny_corpus, tmp_path):
    with pytest.raises(GraphError, match="no graphs of 8 to 10 nodes"):
        train(_config(tiny_corpus, max_nodes=10), iterations=1, out=tmp_path / "x.npz")
