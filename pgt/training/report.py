"""Tables printed while training and at its end (rich)."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from pgt.data.metrics import METRIC_NAMES

console = Console()


class EpochPrinter:
    """on_epoch callback: one aligned row per epoch, the header first."""

    def __init__(self) -> None:
        self.started = False
        self.refitting = False

    def __call__(self, row: dict, checkpoint_dir=None) -> None:
        if row.get("learned_from_validation") and not self.refitting:  # a refit's second run begins
            console.print("refit on train + validation (validation columns: scores of data it learns from)",
                          style="bold")
            self.refitting = True
        if not self.started:
            console.print(f"{'epoch':>5} {'loss':>8} {'lr':>9} {'val strict@1':>12} {'acc@1':>6} {'acc@5':>6} "
                          f"{'mrr':>6} {'samples/s':>9} {'s':>6}  best", style="bold")
            self.started = True
        v = row["validation"]
        mark = "*" if row["best_epoch"] == row["epoch"] else ""
        console.print(f"{row['epoch'] + 1:>5} {row['train_loss']:>8.4f} {row['lr']:>9.2e} {v['strict']['acc@1']:>12.2f} "
                      f"{v['acc@1']:>6.2f} {v['acc@5']:>6.2f} {v['mrr']:>6.2f} {row['samples_per_second']:>9.0f} "
                      f"{row['seconds']:>6.1f}  {mark}")


def metric_rows(metrics: dict, label: str) -> dict[str, dict]:
    """Table rows for one split's compute_all dict: strict first (the exact place), then the protocol's."""
    strict = metrics["strict"]
    return {f"{label}, strict": strict, "  target's place in history": strict["in_history"],
            "  target's place not in history": strict["outside_history"],
            f"{label}, protocol": metrics, "  target id in history": metrics["in_history"],
            "  target id not in history": metrics["outside_history"]}


def metrics_table(results: dict[str, dict], title: str) -> Table:
    """Rows of label -> metrics dict (strict rows have no f1), columns in the published tables' order."""
    table = Table(title=title)
    table.add_column("")
    for name in METRIC_NAMES:
        table.add_column(name, justify="right")
    for label, m in results.items():
        table.add_row(label, *(_cell(m, n) for n in METRIC_NAMES))
    return table


def _cell(metrics: dict, name: str) -> str:
    if name not in metrics:
        return "-"
    return str(metrics[name]) if name == "n" else f"{metrics[name]:.2f}"


def new_place_line(metrics: dict) -> str:
    d = metrics["new_place"]
    return (f"new places: {d['rate']:.2f}% of targets; top-1 \"new place\" in {d['predicted']:.2f}% of samples, "
            f"precision {d['precision']:.2f}%, recall {d['recall']:.2f}%")


def print_metrics(result: dict) -> None:
    rows = metric_rows(result["test"], "test") | {"validation, strict": result["validation"]["strict"],
                                                  "validation, protocol": result["validation"]}
    if "deployment" in result:  # recency from the last visit's day: what a live prediction knows
        rows |= {f"{split}, deployment strict": metrics["strict"] for split, metrics in result["deployment"].items()}
    refit = result.get("refit")
    epochs = (f"refit on train + validation for {refit['epochs']} epochs, chosen on validation (held out: the "
              f"selection run's figures)" if refit else f"best epoch {result['best_epoch']} of {result['epochs_run']}")
    console.print(metrics_table(rows, f"{result['model']}: {epochs}, {result['parameters']:,} parameters, "
                                      f"{result['samples_per_second']:.0f} samples/s"))
    console.print(f"test {new_place_line(result['test'])}")


def metrics_markdown(test: dict, validation: dict, title: str, links: dict[str, str]) -> str:
    """Test metrics (strict, then the protocol's; all, target in / not in the history) as a Markdown table,
    the new-place detection, the validation Acc@1 of the selected model, then links."""
    rows = metric_rows(test, "test")
    lines = [f"# {title}", "", "Strict: a target counts only where its exact place was ranked. Protocol: the "
             "published reading, where any place unseen in train is id 1 and id 1 for id 1 counts as a hit.", "",
             "| | " + " | ".join(METRIC_NAMES) + " |", "|---" * (len(METRIC_NAMES) + 1) + "|"]
    for label, m in rows.items():
        lines.append(f"| {label.strip()} | " + " | ".join(_cell(m, n) for n in METRIC_NAMES) + " |")
    lines += ["", f"Test {new_place_line(test)}.", "",
              f"Validation Acc@1 of the selected model: strict {validation['strict']['acc@1']:.2f}, "
              f"protocol {validation['acc@1']:.2f}", ""]
    lines += [f"- {name}: {value}" for name, value in links.items()]
    return "\n".join(lines) + "\n"
