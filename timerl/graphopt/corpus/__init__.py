"""The graph corpus of graphopt: graphs exported from PyTorch models and from timerl's own
programs (one graph per loop body, by ``timerl.schedule.to_graph``), and synthetic DAGs.

``build_corpus`` writes every graph as JSON under a fixed train/val/test/test-large split by
family; ``load_index`` and ``load_graph`` read a built corpus back.
"""

from timerl.graphopt.corpus.build import build_corpus, load_graph, load_index
from timerl.graphopt.corpus.check import check_graph
from timerl.graphopt.corpus.split import FAMILY_SPLIT, SPLITS

__all__ = [
    "FAMILY_SPLIT",
    "SPLITS",
    "build_corpus",
    "check_graph",
    "load_graph",
    "load_index",
]
