"""The table `pgt tune` prints: one row per trial, best first (by the sweep's objective)."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table


def print_sweep(result: dict) -> None:
    console = Console(width=max(Console().width, 130))
    table = Table(title=f"{len(result['trials'])} trials; best {result['best_trial']} by validation {result['objective']} "
                        f"on its one seed: validation strict acc@1 {result['best_validation_strict_acc@1']:.2f} "
                        f"(protocol {result['best_validation_acc@1']:.2f})")
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
    console.print(table)
    confirmation = result.get("confirmation")
    if confirmation:
        seeds = confirmation["seeds_per_finalist"]
        finalists = Table(title=f"finalists on {seeds} fresh seeds: the winner is the best mean validation "
                                f"{confirmation['objective']} ({confirmation.get('winner', 'none: unfinished')})")
        for col in ("finalist", "d_model", "nhead", "dropout", "lr", "mean", "std", "per seed", "search (1 seed)"):
            finalists.add_column(col, justify="left" if col in ("finalist", "per seed") else "right")
        for row in confirmation["finalists"]:
            c = row["config"]
            finalists.add_row(row["name"], str(c["d_model"]), str(c["nhead"]), f"{c['dropout']:.2f}", f"{c['lr']:.1e}",
                              f"{row['mean']:.2f}", f"{row['std']:.2f}", " ".join(f"{v:.2f}" for v in row["validation_scores"]),
                              f"{row['search_score']:.2f}" if row["search_score"] is not None else "-")
        console.print(finalists)
    final = result.get("final")
    if final:
        test = final["test"]
        console.print(f"the winner's recipe trained as `pgt train --recipe-file` would (seed {final['seed']}): test strict "
                      f"acc@1 {test['strict']['acc@1']:.2f} (protocol {test['acc@1']:.2f}), validation strict acc@1 "
                      f"{final['validation']['strict']['acc@1']:.2f}")
