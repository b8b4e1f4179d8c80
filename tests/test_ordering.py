"""The run's order (tests/support/ordering.py): the longest files first, nothing else moved."""

from __future__ import annotations

from dataclasses import dataclass

from tests.support import paths
from tests.support.ordering import FILE_SECONDS, pytest_collection_modifyitems


@dataclass
class FakeItem:
    nodeid: str


def test_every_file_the_order_names_exists() -> None:
    missing = [name for name in FILE_SECONDS if not (paths.ROOT / name).is_file()]
    assert not missing, f"renamed or removed: {missing} (tests/support/ordering.py)"


def test_the_longest_files_go_first_and_the_rest_keep_their_order() -> None:
    longest, second = sorted(FILE_SECONDS, key=lambda name: -FILE_SECONDS[name])[:2]
    names = ["tests/a.py::t1", f"{second}::x", "tests/b.py::t1", f"{longest}::y", "tests/a.py::t2", f"{second}::z"]
    items = [FakeItem(name) for name in names]
    pytest_collection_modifyitems(items)  # type: ignore[arg-type]
    assert [item.nodeid for item in items] == [
        f"{longest}::y",
        f"{second}::x",
        f"{second}::z",
        "tests/a.py::t1",
        "tests/b.py::t1",
        "tests/a.py::t2",
    ]
