"""benchmarks/distillation.py's cross-entropy against the teachers, and the loss a student trains on."""

from __future__ import annotations

import math

import torch

from tests.benchmarks.conftest import load_benchmark


def test_the_teachers_cross_entropy_is_against_their_mean_and_ignores_columns_they_rule_out():
    teacher_cross_entropy = load_benchmark("distillation").teacher_cross_entropy
    # two teachers: their mean is (0.5, 0.5, 0) on the one row; the student rules column 2 out (-inf) as they do
    teachers = torch.log(torch.tensor([[[0.8, 0.2, 0.0]], [[0.2, 0.8, 0.0]]]))  # (T=2, B=1, C=3)
    student = torch.log(torch.tensor([[0.25, 0.75, 0.0]]))  # (B=1, C=3)
    loss = teacher_cross_entropy(student, teachers)
    assert loss.shape == (1,) and math.isfinite(loss.item())
    assert loss.item() == torch.tensor(-(0.5 * math.log(0.25) + 0.5 * math.log(0.75))).float().item()
    # the student that answers the teachers' mean has the least: their entropy, log 2
    assert teacher_cross_entropy(torch.log(torch.tensor([[0.5, 0.5, 0.0]])), teachers).item() == torch.tensor(
        math.log(2)).float().item()


def test_a_student_s_loss_is_its_own_with_alpha_of_its_label_cross_entropy_swapped_for_the_teachers(
        tiny_sequences, tmp_path):
    from pgt.config import TrainConfig
    from pgt.data.dataset import Vocab, load_splits
    from pgt.network.model import build_model
    from pgt.training.loss import batch_loss, criterion

    distilled_loss = load_benchmark("distillation").distilled_loss
    cfg = TrainConfig.from_recipe("tuned", data_dir=str(tiny_sequences), out_dir=str(tmp_path))
    vocab = Vocab.from_manifest(tiny_sequences)
    model_cfg = cfg.model_config(vocab)
    batch = load_splits(tiny_sequences, cfg.network.max_len, vocab, names=("train",))["train"].__getitems__(
        list(range(16)))
    torch.manual_seed(0)
    student, teacher = build_model(model_cfg).eval(), build_model(model_cfg).eval()  # eval: no dropout draws
    plain = batch_loss(student, batch, model_cfg, cfg)
    assert torch.equal(distilled_loss([student], 0.0)(student, batch, model_cfg, cfg), plain)
    # taught by itself at alpha 1: its label criterion swapped for the cross-entropy against its own answer
    log_probs = student(*batch.inputs()).log_probs.float()
    own = -(torch.where(log_probs.exp() > 0, log_probs.exp() * log_probs, torch.zeros_like(log_probs))).sum(1).mean()
    expected = plain - criterion(log_probs, batch, model_cfg, cfg) + own
    assert torch.allclose(distilled_loss([student], 1.0)(student, batch, model_cfg, cfg), expected)
    # another teacher moves it, and only through the teachers' term
    assert not torch.allclose(distilled_loss([teacher], 1.0)(student, batch, model_cfg, cfg), expected)


def test_mixed_ensembles_pick_distinct_seeds_from_the_two_sets_cached_passes(tiny_sequences):
    """mixed() reads the plain networks' and the students' cached passes (ensemble_size.network_log_probs): with three
    seeds and ensembles of two, one student and one plain network of another seed, six ways, whose mean is the one
    ensemble_metrics gives each of them over all six networks' passes scored at once."""
    import itertools

    import numpy as np

    from pgt.config import TrainConfig
    from pgt.data.dataset import Vocab, load_splits
    from pgt.network.model import build_model

    distillation, ensemble_size = load_benchmark("distillation"), load_benchmark("ensemble_size")
    cfg = TrainConfig.from_recipe("tuned", data_dir=str(tiny_sequences), out_dir="o")
    model_cfg = cfg.model_config(Vocab.from_manifest(tiny_sequences))
    validation = load_splits(tiny_sequences, cfg.network.max_len, Vocab.from_manifest(tiny_sequences),
                             names=("validation",))["validation"]
    networks = []
    for seed in range(6):  # seeds 0-2 plain, 3-5 their students
        torch.manual_seed(seed)
        networks.append(build_model(model_cfg).eval())
    plain, students = (ensemble_size.network_log_probs(nets, validation) for nets in (networks[:3], networks[3:]))
    rows = distillation.mixed(plain, students, 2, validation, model_cfg)
    combos = [(p, 3 + s) for p, s in itertools.permutations(range(3), 2)]
    every = ensemble_size.network_log_probs(networks, validation)
    expected = np.mean([ensemble_size.ensemble_metrics(every, combo, validation, model_cfg)["strict"]["acc@1"]
                        for combo in combos])
    assert [(r["taught"], r["combinations"]) for r in rows] == [(1, 6)]
    assert rows[0]["protocol_validation_strict_acc@1"]["mean"] == round(float(expected), 2)
