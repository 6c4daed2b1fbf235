"""The table `pgt tune` prints: one row per trial, best first."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table


def print_sweep(result: dict) -> None:
    table = Table(title=f"{len(result['trials'])} trials; best {result['best_trial']}: validation acc@1 "
                        f"{result['best_validation_acc@1']:.2f}, test acc@1 {result['best_test']['acc@1']:.2f}")
    for col in ("trial", "d_model", "nhead", "layers", "dropout", "lr", "weight decay", "epochs", "val acc@1",
                "test acc@1", "status"):
        table.add_column(col, justify="left" if col in ("trial", "status") else "right")
    for row in result["trials"]:
        c = row["config"]
        val = row["best_validation_acc@1"]
        table.add_row(row["trial_id"], str(c["d_model"]), str(c["nhead"]), str(c["num_layers"]), f"{c['dropout']:.2f}",
                      f"{c['lr']:.1e}", f"{c['weight_decay']:.1e}", str(row["epochs"]),
                      f"{val:.2f}" if val is not None else "-",
                      f"{row['test']['acc@1']:.2f}" if row["test"] else "-", row["status"])
    Console(width=max(Console().width, 130)).print(table)
