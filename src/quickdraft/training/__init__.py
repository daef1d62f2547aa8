"""DistillSpec: distil a draft towards the target (losses, data generators, trainer, evaluation)."""

from quickdraft.training.data import Batch, Example, Mixture, parse_mix, sharegpt_examples
from quickdraft.training.losses import LossProcessing, acceptance, distill_loss, fkl, jsd, make_divergence, rkl, tvd
from quickdraft.training.scoring import scored_logits
from quickdraft.training.student import Student, make_student, save_delta
from quickdraft.training.trainer import DistillConfig, Distiller
from quickdraft.weights.delta import load_delta

__all__ = [
    "Batch",
    "DistillConfig",
    "Distiller",
    "Example",
    "LossProcessing",
    "Mixture",
    "Student",
    "acceptance",
    "distill_loss",
    "fkl",
    "jsd",
    "load_delta",
    "make_divergence",
    "make_student",
    "parse_mix",
    "rkl",
    "save_delta",
    "scored_logits",
    "sharegpt_examples",
    "tvd",
]
