"""What typed payloads (pgworkerd.typed) cost a job: the child's validation before the
handler runs (`typed.bind`), per job, for a plain handler (the cost every untyped job
pays: a cache look-up), a dataclass and a Pydantic model, with a small payload and one of
1,000 items; the first job of a fresh child (the declaration worked out: annotations
resolved, types checked), in a fresh interpreter each time; and the enqueue side
(`typed.payload_json`: load, dump, load again).

    .venv/bin/python bench/typed_payloads_bench.py [--short]

No database. Medians of repeated blocks are printed; a benchmark, not a test: nothing is
asserted.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pydantic

from pgworkerd import typed


@dataclass
class Item:
    sku: str
    quantity: int
    price: float


@dataclass
class Order:
    customer: str
    items: list[Item] = field(default_factory=list)
    note: str | None = None


class ItemModel(pydantic.BaseModel):
    sku: str
    quantity: int
    price: float


class OrderModel(pydantic.BaseModel):
    customer: str
    items: list[ItemModel] = []
    note: str | None = None


def plain(job: Any) -> None: ...


def with_dataclass(job: Any, order: Order) -> None: ...


def with_model(job: Any, order: OrderModel) -> None: ...


def payload(items: int) -> dict[str, Any]:
    return {
        "customer": "c-42",
        "items": [{"sku": f"s{n}", "quantity": n, "price": 1.5} for n in range(items)],
    }


def per_call(fn: Callable[[], Any], calls: int, blocks: int) -> float:
    """Median seconds per call over `blocks` blocks of `calls` calls."""
    times = []
    for _ in range(blocks):
        started = time.perf_counter()
        for _ in range(calls):
            fn()
        times.append((time.perf_counter() - started) / calls)
    return statistics.median(times)


FIRST_JOB = """
import sys, time
sys.path.insert(0, {bench!r})
import pydantic  # (a handler module that uses a model imports it: not counted)
import typed_payloads_bench as b
from pgworkerd import typed
started = time.perf_counter()
typed.bind(b.{handler}, b.payload(1))
print(time.perf_counter() - started)
"""


def first_job(handler: str, runs: int) -> float:
    """Median seconds of the first bind in a fresh interpreter (the declaration included)."""
    code = FIRST_JOB.format(bench=str(Path(__file__).parent), handler=handler)
    out = [
        float(
            subprocess.run(
                [sys.executable, "-c", code], capture_output=True, text=True, check=True
            ).stdout
        )
        for _ in range(runs)
    ]
    return statistics.median(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--short", action="store_true", help="fewer repetitions (CI)")
    args = parser.parse_args()
    calls, blocks, runs = (200, 3, 2) if args.short else (2_000, 7, 7)
    print(f"python {platform.python_version()}, pydantic {pydantic.VERSION}, {platform.machine()}")
    print(f"{calls} calls x {blocks} blocks (medians); first job: {runs} fresh interpreters")
    small, big = payload(1), payload(1_000)
    rows = [
        ("plain handler (any untyped job)", lambda: typed.bind(plain, small), calls),
        ("dataclass, 1 item", lambda: typed.bind(with_dataclass, small), calls),
        ("dataclass, 1,000 items", lambda: typed.bind(with_dataclass, big), max(calls // 100, 3)),
        ("pydantic, 1 item", lambda: typed.bind(with_model, small), calls),
        ("pydantic, 1,000 items", lambda: typed.bind(with_model, big), max(calls // 100, 3)),
    ]
    print("\nchild, per job (typed.bind):")
    for label, fn, n in rows:
        print(f"  {label:34s} {per_call(fn, n, blocks) * 1e6:10.1f} µs")
    print("\nchild, first job of a fresh interpreter (declaration + bind):")
    for handler in ("plain", "with_dataclass", "with_model"):
        print(f"  {handler:34s} {first_job(handler, runs) * 1e3:10.2f} ms")
    order = Order("c-42", [Item("s", 1, 1.5)])
    model = OrderModel(customer="c-42", items=[ItemModel(sku="s", quantity=1, price=1.5)])
    print("\nenqueue side, per job (typed.payload_json: load, dump, load):")
    for label, fn in (
        ("dataclass value, 1 item", lambda: typed.payload_json(with_dataclass, order)),
        ("dataclass from a mapping, 1 item", lambda: typed.payload_json(with_dataclass, small)),
        ("pydantic value, 1 item", lambda: typed.payload_json(with_model, model)),
    ):
        print(f"  {label:34s} {per_call(fn, calls, blocks) * 1e6:10.1f} µs")


if __name__ == "__main__":
    main()
