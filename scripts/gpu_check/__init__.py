"""One self-contained decode check for a CUDA GPU (e.g. an H200 with JAX+CUDA preinstalled).

Builds random bf16 checkpoints with the released models' shapes directly as JAX params on the
device (no torch, no files, nothing downloaded), runs the portable and the compiled engine on
them, and prints tokens/s, ms per recurrent pass, compile seconds, and the per-pass time against
the HBM roofline (bytes of the weights one pass reads at the device's bandwidth: the plan's
target of its kind, alodlm_jax/data/targets, else the H200's 4.8 TB/s); then the batch sweep:
the compiled engine with continuous batching at each --batches size on the same prompts, suite
tokens/s against one request at a time, the seconds of its first run (the batch and admit
programs compiled, the first prompts admitted and decoded), and XLA's cost analysis of one batch
step (bytes moved at the bandwidth: the step time it allows) beside the measured time per step,
and the plan's prediction for the same batch program (alodlm-jax-plan's figures for this device:
compile seconds, device memory, bytes, FLOPs and kernels per step, the kernels launched outside
command buffers, its predicted ms/step; block PLAN, gpu_check/engines.py) beside the measured ms/step (the
batch program's run time over its own count of steps; the single-request program's time per
pass), so one run recalibrates the plan (alodlm_jax/plan/launches.py: TIME_MODEL). On a GPU the
compiled engine runs the accelerators' fixed shapes (one row shape, attention over the whole
cache: alodlm_jax/network/rows.py), and on one GPU every pass attends in the Triton kernel
(alodlm_jax/kernels/window.py; "shapes fixed-kernel"), as evaluate does. In bf16 a batch's
products run over more rows (other tiles, other sums) than one request's, so "same tokens" may
read False at a near tie; in fp32 it is expected True.

  1.7B-shaped: 28 layers, loop [0,28), H 2048, I 6144, 16/8 heads x 128, vocab 151936
  8B-shaped:   36 layers, loop [10,26), H 4096, I 12288, 32/8 heads x 128, vocab 151936

Usage:  bash scripts/gpu_check.sh [--tiny] [--max_new_tokens N] [--models 1.7b,8b] [--batches 1,8,32]
                                 [--graphs] [--no_attention] [--xla_products] [--separate_norms]
                                 [--separate_combine]
                                 [--layouts | --layouts_only]
        bash scripts/gpu_check.sh --goals [--budget_s 360] [--json goals.json] [--models ...]
        bash scripts/gpu_check.sh --parity [gpu_parity.py's options]
  --goals    only the decode-speed goals of docs/plan.md, in one run that starts nothing after
             --budget_s seconds (block GOALS, gpu_check/goals.py: what it runs, in which order): a 256-token
             prompt and 128 new by default, batch 1 against its weights at the bandwidth,
             batches 8 and 32 (first run, step against the floors, tokens/s against one at a
             time), each measured step against the plan's prediction, the combined attention's
             ordering, and graphs; a verdict a goal at the end ("GOALS"), and in --json.
  --parity   only the fp32 parity check against the CPU (scripts/gpu_parity.py: several small
             topologies, one request at a time and batches 8 and 32; exit status 1 on any
             difference); the other options are gpu_parity.py's.
  --tiny     small shapes of both topologies, for a CPU smoke test of this script.
  --graphs   also the compiled engine with loops and branches in command buffers (CUDA graph
             conditional nodes: CompiledEngine(..., graphs=True), alodlm-jax-plan
             --command_buffers graphs) beside XLA's defaults, for the single-request program and
             at each batch size: measured against predicted ms, and whether its tokens equal the
             defaults' (the same program under other launch machinery: expected equal).
  --no_attention  skip the first block of each model (block ATTENTION, gpu_check/kernel_checks.py): the Triton
             attention kernel alone at each --batches size and a short, a long and a full
             prefix of a 5,376-slot cache (a 1,024-token prompt and 4,096 new), its prefix
             walked in parts (flash-decoding, kernels.window.gpu_splits: what the engine runs)
             and in one part per request and KV head: us per call, K/V read per second, and
             how far apart their outputs are; the heads' norms and RoPE in their Triton
             kernel (alodlm_jax/kernels/head_norm.py) against XLA's form on this device, and
             (one request's window) the attention kernel that applies them itself against
             that kernel and the attention kernel ("normed attention"), and the attention
             kernel's last part combining a long prefix's parts against a second kernel
             combining them, 100 calls each ("combined attention"); and a
             window layer's products with their norms and residual adds in Triton kernels
             (alodlm_jax/kernels/matmul.py, one request's rows and two requests') against
             XLA's form: us per layer, weights read per second, outputs equal.
  --xla_products  the engines run a window layer's products in XLA's form
             (kernels.matmul.MAX_ROWS = 0), to compare their ms/pass with a run without it.
  --separate_norms  the engines apply the heads' norms and RoPE in a kernel of their own, not
             in the attention kernel (kernels.window.NORMS_IN_ATTENTION = False), likewise.
  --separate_combine  the single-request program combines a prefix's parts in a kernel of
             their own, not in the attention kernel's last part to finish
             (kernels.window.COMBINE_IN_ATTENTION = False), likewise.
  --layouts  (block LAYOUTS, gpu_check/layouts.py) also the compiled engine with continuous batching
             on every ("data", "model") mesh the visible devices allow (one H200: data=1,model=1
             through the mesh path), against one-device batch 1: tokens/s, same tokens, and the
             collectives of one batch step. --layouts_only runs only that block.
Run from a checkout, installed or not (scripts/source_tree.py), from any folder.

The check is this package, run as ``python -m gpu_check`` with ``scripts/`` on the path (what
``scripts/gpu_check.sh`` does); each block is a function the tests can call:
:mod:`~gpu_check.cli` (the command line, :func:`gpu_check.cli.main`, and the default run),
:mod:`~gpu_check.kernel_checks` (ATTENTION), :mod:`~gpu_check.engines` (the batch sweep, PLAN),
:mod:`~gpu_check.goals` (GOALS), :mod:`~gpu_check.layouts` (LAYOUTS), :mod:`~gpu_check.common`
(what they share). ``scripts/gpu_check.sh --parity`` runs ``scripts/gpu_parity.py`` instead.
"""
