"""Tables printed while training and at its end (rich)."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from pgt.metrics import METRIC_NAMES

console = Console()


class EpochPrinter:
    """on_epoch callback: one aligned row per epoch, the header first."""

    def __init__(self) -> None:
        self.started = False

    def __call__(self, row: dict, checkpoint_dir=None) -> None:
        if not self.started:
            console.print(f"{'epoch':>5} {'loss':>8} {'lr':>9} {'val acc@1':>9} {'acc@5':>6} {'mrr':>6} "
                          f"{'samples/s':>9} {'s':>6}  best", style="bold")
            self.started = True
        v = row["validation"]
        mark = "*" if row["best_epoch"] == row["epoch"] else ""
        console.print(f"{row['epoch'] + 1:>5} {row['train_loss']:>8.4f} {row['lr']:>9.2e} {v['acc@1']:>9.2f} "
                      f"{v['acc@5']:>6.2f} {v['mrr']:>6.2f} {row['samples_per_second']:>9.0f} {row['seconds']:>6.1f}  {mark}")


def metrics_table(results: dict[str, dict], title: str) -> Table:
    """Rows of split -> metrics dict (as compute_all returns), columns in SPEC §4's order."""
    table = Table(title=title)
    table.add_column("")
    for name in METRIC_NAMES:
        table.add_column(name, justify="right")
    for label, m in results.items():
        table.add_row(label, *(f"{m[n]:.2f}" if n != "n" else str(m[n]) for n in METRIC_NAMES))
    return table


def print_metrics(result: dict) -> None:
    rows = {"test": result["test"], "  target in history": result["test"]["in_history"],
            "  target not in history": result["test"]["outside_history"], "validation": result["validation"]}
    console.print(metrics_table(rows, f"{result['model']}: best epoch {result['best_epoch']} of {result['epochs_run']}, "
                                      f"{result['parameters']:,} parameters, {result['samples_per_second']:.0f} samples/s"))


def metrics_markdown(test: dict, validation_acc1: float, title: str, links: dict[str, str]) -> str:
    """Test metrics (all, target in / not in the history) as a Markdown table, the validation Acc@1, then links."""
    from pgt.metrics import METRIC_NAMES

    rows = {"test": test, "test, target in history": test["in_history"],
            "test, target not in history": test["outside_history"]}
    lines = [f"# {title}", "", "| | " + " | ".join(METRIC_NAMES) + " |", "|---" * (len(METRIC_NAMES) + 1) + "|"]
    for label, m in rows.items():
        lines.append(f"| {label} | " + " | ".join(str(m[n]) if n == "n" else f"{m[n]:.2f}" for n in METRIC_NAMES) + " |")
    lines += ["", f"Validation Acc@1 of the selected model: {validation_acc1:.2f}", ""]
    lines += [f"- {name}: {value}" for name, value in links.items()]
    return "\n".join(lines) + "\n"
