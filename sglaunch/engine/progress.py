"""The start-up progress bar the engine shows on rank 0 (weights loading, CUDA-graph capture)."""

from __future__ import annotations

from contextlib import nullcontext


def step_bar(label: str, show: bool, total: int):
    """Context manager yielding an `advance()` callable: a rich bar on stderr, or nothing."""
    if not show:
        return nullcontext(lambda: None)
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    class _Bar:
        def __enter__(self):
            self.progress = Progress(TextColumn(label), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                                     console=Console(stderr=True))
            self.progress.start()
            task = self.progress.add_task(label, total=total)
            return lambda: self.progress.advance(task)

        def __exit__(self, *exc):
            self.progress.stop()

    return _Bar()
