"""The table `pgt tune` prints: one row per trial, best first (by the sweep's objective)."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table


def print_sweep(result: dict) -> None:
    test = result["best_test"]
    table = Table(title=f"{len(result['trials'])} trials; best {result['best_trial']} by validation {result['objective']}: "
                        f"validation strict acc@1 {result['best_validation_strict_acc@1']:.2f} "
                        f"(protocol {result['best_validation_acc@1']:.2f}); test strict acc@1 "
                        f"{test['strict']['acc@1']:.2f} (protocol {test['acc@1']:.2f})")
    for col in ("trial", "d_model", "nhead", "layers", "dropout", "lr", "weight decay", "epochs", "val strict@1",
                "val acc@1", "status"):
        table.add_column(col, justify="left" if col in ("trial", "status") else "right")
    for row in result["trials"]:
        c = row["config"]
        strict, protocol = row["best_validation_strict_acc@1"], row["best_validation_acc@1"]
        table.add_row(row["trial_id"], str(c["d_model"]), str(c["nhead"]), str(c["num_layers"]), f"{c['dropout']:.2f}",
                      f"{c['lr']:.1e}", f"{c['weight_decay']:.1e}", str(row["epochs"]),
                      f"{strict:.2f}" if strict is not None else "-", f"{protocol:.2f}" if protocol is not None else "-",
                      row["status"])
    Console(width=max(Console().width, 130)).print(table)
