"""Benchmark: whether `tuned` networks taught by an ensemble of `tuned` networks (knowledge distillation, "born-again"
students of the teachers' own architecture) beat networks trained on the labels alone, chosen on validation only.

The teachers are the networks benchmarks/ensemble_size.py trained (its --work, --teachers seeds). Each student is a
`tuned` network of a fresh seed whose training loss is its own (label-smoothed cross-entropy, new-place weight,
arrival head) with the cross-entropy part mixed with the teachers' answer: (1 - alpha) * cross-entropy + alpha *
cross-entropy against the mean of the teachers' probabilities on the same batch (the same simulated unseen places),
the teachers in eval mode and without gradients. The students, and beside them the same seeds' networks trained on
the labels alone (ensemble_size.py's --work), are scored on the validation split alone and as ensembles of
--members (the mean of their probabilities, as `ensemble` serves), with the protocol's inputs and as deployed, and as
ensembles mixing students and plain networks of distinct seeds. Test is never scored (the teachers and the students
are trained with evaluate_test off).

Writes JSON (default benchmarks/results/distillation.json) and prints a table.

    python benchmarks/distillation.py [--teachers 0 1000 2000 3000 1 1001] [--seeds 2 3 4 5 6 7] [--alpha 0.5]
                                      [--members 5] [--plain .state/benchmarks/ensemble-size]
                                      [--work .state/benchmarks/distillation] [--data-dir DIR]
"""

from __future__ import annotations

import argparse
import itertools
import json
import multiprocessing
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
from ensemble_size import (  # noqa: E402 - after sys.path gains the benchmarks
    SEEDS,
    SELECTION,
    WORK,
    ensemble_metrics,
    input_splits,
    kept_member,
    network_arguments,
    scored,
    shown,
    split_log_probs,
    trained_networks,
    validation_split,
)
from preprocess import machine, shown_path  # noqa: E402 - after sys.path gains the benchmarks
from train import mean_std  # noqa: E402 - after sys.path gains the benchmarks

DEFAULT_RESULTS = ROOT / "benchmarks" / "results" / "distillation.json"


def teacher_cross_entropy(student_log_probs, teacher_log_probs):
    """(B,) the cross-entropy of a student's (B, C) log-probabilities against the mean of the teachers' (T, B, C)
    probabilities; columns no teacher gives any probability count for nothing (the student's may be -inf there)."""
    import torch

    target = teacher_log_probs.exp().mean(dim=0)  # (B, C)
    products = torch.where(target > 0, target * student_log_probs, torch.zeros_like(target))
    return -products.sum(dim=1)


def distilled_loss(teachers: list, alpha: float):
    """pgt.training.loss.batch_loss with the student's cross-entropy mixed with the teachers' (teacher_cross_entropy):
    the network's loss (auxiliary heads included) less alpha times its label criterion, plus alpha times the
    cross-entropy against the teachers' mean probabilities on the same batch."""
    import torch

    from pgt.training.loss import criterion, training_loss, training_pass

    def loss_of(model, batch, model_cfg, cfg, amp_dtype=None):
        out = training_pass(model, batch, cfg, amp_dtype)
        with torch.no_grad():
            taught = torch.stack([training_pass(t, batch, cfg, amp_dtype).log_probs.float()
                                  for t in teachers])  # (T, B, C)
        log_probs = out.log_probs.float()
        labels = criterion(log_probs, batch, model_cfg, cfg)
        return training_loss(out, batch, model_cfg, cfg) + alpha * (
            teacher_cross_entropy(log_probs, taught).mean() - labels)

    return loss_of


def train_student(seed: int, data_dir: str, out: str, teachers: list[str], alpha: float) -> dict:
    """One `tuned` network of `seed` taught by the networks in `teachers` (their best.pt), on validation only; a
    finished student (best.pt and metrics.json in `out`) is kept."""
    if not kept_member(Path(out)):
        import torch

        import pgt.training.state
        from pgt.config import TrainConfig
        from pgt.network.checkpoint import load_checkpoint
        from pgt.training.train import train_loop_per_worker

        torch.set_num_threads(1)
        models = [load_checkpoint(Path(run) / "best.pt")[0].eval() for run in teachers]
        for model in models:
            model.requires_grad_(False)
        # the one training step's loss (TrainState.batch_loss, set by setup from this module's name)
        pgt.training.state.batch_loss = distilled_loss(models, alpha)
        cfg = TrainConfig.from_recipe("tuned", data_dir=data_dir, out_dir=out, seed=seed, resume=False, threads=1,
                                      evaluate_test=False)
        began = time.perf_counter()
        result = train_loop_per_worker(cfg.to_dict())
        (Path(out) / "distillation.json").write_text(json.dumps(
            {"teachers": teachers, "alpha": alpha, "train_s": round(time.perf_counter() - began, 1)}) + "\n")
    result = json.loads((Path(out) / "metrics.json").read_text())
    taught = json.loads((Path(out) / "distillation.json").read_text())
    if taught["teachers"] != teachers or taught["alpha"] != alpha:
        raise SystemExit(f"{out} holds a student of other teachers or another alpha; give another --work")
    return {"seed": seed, "best_epoch": result["best_epoch"], "train_s": taught["train_s"],
            "validation_strict_acc@1": result["validation"]["strict"]["acc@1"]}


def mixed(plain: list, students: list, members: int, validation, cfg) -> list[dict]:
    """Strict validation Acc@1 of ensembles of `members` networks of distinct seeds, `taught` of them students and the
    rest plain networks, for each count of students from 1 to members - 1: `plain` and `students` are the two sets'
    member_log_probs on the validation split, the i-th network of each of the same seed."""
    import torch

    cached = [(indices, batch, torch.cat([mine, theirs]))  # (2 M, B, V + S): the plain networks, then the students
              for (indices, batch, mine), (_, _, theirs) in zip(plain, students, strict=True)]
    count = len(plain[0][2])  # the networks of each set
    seeds, rows = range(count), []
    for taught in range(1, members):
        combos = [(*untaught, *(count + i for i in chosen))
                  for untaught in itertools.combinations(seeds, members - taught)
                  for chosen in itertools.combinations(sorted(set(seeds) - set(untaught)), taught)]
        rows.append({"taught": taught, "combinations": len(combos), "protocol_validation_strict_acc@1": mean_std(
            [ensemble_metrics(cached, combo, validation, cfg)["strict"]["acc@1"] for combo in combos])})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    # --plain: the teachers, and the students' seeds on the labels alone; --seeds: the students'
    network_arguments(parser, DEFAULT_RESULTS, networks="--plain")
    parser.set_defaults(seeds=[2, 3, 4, 5, 6, 7])
    parser.add_argument("--teachers", type=int, nargs="+", default=SEEDS, help="seeds of the teachers in --plain")
    parser.add_argument("--alpha", type=float, default=0.5, help="the teachers' share of the cross-entropy, in (0, 1]")
    parser.add_argument("--members", type=int, default=5, help="the ensemble's size K")
    parser.add_argument("--work", type=Path, default=WORK / "distillation", help="where the students are trained")
    args = parser.parse_args()
    teachers = trained_networks(parser, args.plain, args.teachers)
    plain = trained_networks(parser, args.plain, args.seeds)
    if not 0 < args.alpha <= 1:
        parser.error(f"--alpha {args.alpha}: expected a share in (0, 1]")
    if not 2 <= args.members <= len(args.seeds):
        parser.error(f"--members {args.members}: expected 2 to {len(args.seeds)}, the student seeds given")

    from rich.console import Console
    from rich.table import Table

    students = [args.work / f"alpha_{args.alpha:g}" / f"seed_{seed}" for seed in args.seeds]
    # the wall time of the run that trained the students, kept beside them: a later run only scores them
    wall = args.work / f"alpha_{args.alpha:g}" / "train_wall.json"
    untrained = not all(kept_member(student) for student in students)
    began = time.perf_counter()
    # spawned, not forked, as benchmarks/ensemble_size.py trains its members
    with ProcessPoolExecutor(2, mp_context=multiprocessing.get_context("spawn")) as pool:
        trained = list(pool.map(train_student, args.seeds, [str(args.data_dir)] * len(students), map(str, students),
                                [[str(t) for t in teachers]] * len(students), [args.alpha] * len(students)))
    if untrained:
        wall.write_text(json.dumps({"train_wall_s": round(time.perf_counter() - began, 1)}) + "\n")
    train_s = json.loads(wall.read_text())["train_wall_s"] if wall.is_file() else None
    from pgt.network.checkpoint import load_checkpoint

    cfg = load_checkpoint(plain[0] / "best.pt")[1]
    validation = validation_split(args.data_dir, cfg)  # one split for every score
    # one forward pass of each network over each split, which its rows and the mixed ensembles share
    splits = input_splits(validation)
    plain_cached, students_cached = split_log_probs(plain, splits), split_log_probs(students, splits)
    rows = [{"networks": "labels alone", **scored(plain, args.members, validation, cfg, plain_cached)},
            {"networks": f"taught, alpha {args.alpha:g}",
             **scored(students, args.members, validation, cfg, students_cached)}]
    result = {"benchmark": "distillation", "when": datetime.now(timezone.utc).isoformat(timespec="seconds"),
              "machine": machine(), "data": shown_path(args.data_dir), "teachers_from": shown_path(args.plain),
              "teachers": args.teachers, "seeds": args.seeds, "alpha": args.alpha, "members": args.members,
              "teachers_alone": scored(teachers, len(teachers), validation, cfg),
              "selection": SELECTION, "students_trained": trained, "train_wall_s": train_s, "rows": rows,
              "mixed": mixed(plain_cached["protocol"], students_cached["protocol"], args.members, validation, cfg)}
    args.results.parent.mkdir(parents=True, exist_ok=True)
    args.results.write_text(json.dumps(result, indent=2) + "\n")

    table = Table(title=f"`tuned` networks of seeds {', '.join(map(str, args.seeds))}, on labels alone and taught by "
                        f"{len(teachers)} networks, validation split (mean ± std over combinations of seeds)")
    for column in ("networks", "one", f"{args.members}", f"all {len(args.seeds)}", f"{args.members}, as deployed",
                   f"{args.members}, strict MRR", f"{args.members}, Acc@1 (protocol)"):
        table.add_column(column, justify="right")
    for r in rows:
        table.add_row(r["networks"], *(shown(r[key]) for key in (
            "one_protocol_validation_strict_acc@1", "ensemble_protocol_validation_strict_acc@1",
            "all_protocol_validation_strict_acc@1", "ensemble_deployment_validation_strict_acc@1",
            "ensemble_protocol_validation_strict_mrr", "ensemble_protocol_validation_acc@1")))
    Console().print(table)
    for row in result["mixed"]:
        print(f"{args.members} of distinct seeds, {row['taught']} of them taught: "
              f"{shown(row['protocol_validation_strict_acc@1'])} ({row['combinations']} combinations)")
    print(f"the teachers together: {shown(result['teachers_alone']['all_protocol_validation_strict_acc@1'])} strict "
          f"Acc@1; wrote {args.results}")


if __name__ == "__main__":
    main()
