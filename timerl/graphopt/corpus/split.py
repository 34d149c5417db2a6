"""The fixed train/val/test split of the corpus, by family.

Splitting by family (not by graph) keeps near-duplicates, e.g. GPT-2 with 2 and 4 layers, on one
side, so test scores measure transfer to unseen architectures. CNN and synthetic families are
spread over the three splits. The ``timerl`` family (loop bodies of timerl's own RL algorithm
programs, see ``pdg_export``) is held out in ``test``: it measures how the search, trained on
other programs' graphs, transfers to the regions the timerl compiler actually orders. ``test-large`` is the size-extrapolation split: the graphs of the
*test* families that are larger than every training graph. Families therefore never cross the
train / val / test boundary; a test family's graphs sit in ``test`` or ``test-large`` by size.
"""

from __future__ import annotations

from timerl.errors import GraphError

SPLITS = ("train", "val", "test", "test-large")

FAMILY_SPLIT: dict[str, str] = {
    # models
    "gpt2": "train",
    "llama": "train",
    "resnet": "train",
    "randwire": "train",
    "mlp": "train",
    "bert": "val",
    "unet": "val",
    "t5": "test",
    "vit": "test",
    "inception": "test",
    # timerl's own programs (one graph per loop body)
    "timerl": "test",
    # synthetic generators
    "erdos_renyi": "train",
    "layered": "train",
    "sbm": "val",
    "series_parallel": "test",
}


def family_split(family: str) -> str:
    """The split a family belongs to; unknown families are an error, never silently placed."""
    try:
        return FAMILY_SPLIT[family]
    except KeyError:
        raise GraphError(f"family {family!r} has no split assigned") from None


def assign_splits(entries: list[dict]) -> None:
    """Set ``entry["split"]`` for index entries holding ``family`` and ``nodes``.

    Test-family graphs with more nodes than the largest training graph go to ``test-large``.
    Without any training graph among the entries (a build of selected families only) there is
    nothing to compare with, and test-family graphs stay in ``test``.
    """
    largest_train = max(
        (e["nodes"] for e in entries if family_split(e["family"]) == "train"), default=None
    )
    for e in entries:
        split = family_split(e["family"])
        if split == "test" and largest_train is not None and e["nodes"] > largest_train:
            split = "test-large"
        e["split"] = split
