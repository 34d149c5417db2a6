"""The fixed train/val/test split of the corpus, by family.

Splitting by family (not by graph) keeps near-duplicates, e.g. GPT-2 with 2 and 4 layers, on one
side, so test scores measure transfer to unseen architectures. CNN and synthetic families are
spread over the three splits. ``test-large`` is the size-extrapolation split: the graphs of the
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
    """
    largest_train = max(
        (e["nodes"] for e in entries if family_split(e["family"]) == "train"), default=0
    )
    for e in entries:
        split = family_split(e["family"])
        if split == "test" and e["nodes"] > largest_train:
            split = "test-large"
        e["split"] = split
