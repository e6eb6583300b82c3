"""``edgekit finetune``: label-free distillation with INT8 quantization in the loop.

Teacher: the float model. Student: a copy of its graph with batch norms folded into the convolutions
(as the target's converter folds them) and fake quantization where the target quantizes: per-channel
symmetric int8 weights of every convolution and linear layer, per-tensor int8 activations at the graph
inputs and after every compute op (a ReLU or batch norm that follows is fused into the op before it).
Activation ranges are min/max over the data, measured once on the float model and then held; weights
learn around them with a straight-through estimator. The loss is distillation on the outputs (KL at a
temperature for ``class`` outputs, MSE for the others; the kinds are inferred as verify infers them)
and, with ``feature_weight``, MSE on every quantized activation. No labels are read.

What flows back into ``convert``: the learned float weights (batch norms folded), saved as a ``.pt2``
that convert quantizes again from ``--calib``. Weight scales follow from the weights (per-channel
max |w| / 127, what the targets compute). The activation ranges used in training are recorded in the
file's ``edgekit-finetune.json`` (with the recipe and ``finetuned_from``); a jetson convert with
``--option student_ranges=on`` imposes them on the tensors that hold the same values (edgekit.lineage.student_ranges),
so the Q/DQ build computes what the student trained as; otherwise, and on android, convert recalibrates.

Runs on one process or under ``torchrun`` (DistributedDataParallel, gloo on CPU, nccl on CUDA): the
global batch is split across the processes, so the same command trains the same model; only rank 0
writes checkpoints, the output and the progress.

The modules: ``train`` (the run, step by step), ``data`` (the inputs and their split), ``student`` (the
fake-quant student and its teacher; the graph primitives are edgekit.fakequant's), ``batching`` (fixed-batch
graphs), ``losses``, ``launch`` (one process or torchrun), ``checkpoint`` (checkpoints and the written model),
``result`` (what a run returns and the record it writes; reading a record is edgekit.lineage's).
"""

from edgekit.fakequant import SYMMETRIC_ACTS, TARGETS
from edgekit.finetune.checkpoint import CKPT_FORMAT
from edgekit.finetune.data import load_unlabeled
from edgekit.finetune.losses import CLASS_LOSSES, PROB_FLOOR
from edgekit.finetune.result import FinetuneResult, holdout_line, result_json
from edgekit.finetune.train import finetune

__all__ = ["CKPT_FORMAT", "CLASS_LOSSES", "PROB_FLOOR", "SYMMETRIC_ACTS", "TARGETS", "FinetuneResult", "finetune",
           "holdout_line", "load_unlabeled", "result_json"]
