"""The plan's reading of XLA:GPU's thunks after its command-buffer pass: what one step launches
from the host, and the step time it predicts from them."""

import pytest

from alodlm_jax.decode.programs import GPU_COMMAND_TYPES, compiler_options
from alodlm_jax.plan import hlo, launches

# A step loop (unknown trip count) whose body holds a loop of 3 iterations and a conditional.
MODULE = """HloModule jit_f

%inner_body (t: (s32[])) -> (s32[]) {
  %t = (s32[]) parameter(0)
  %i = s32[] get-tuple-element(%t), index=0
  %one = s32[] constant(1)
  %j = s32[] add(%i, %one)
  ROOT %r = (s32[]) tuple(%j)
}

%inner_cond (t: (s32[])) -> pred[] {
  %t = (s32[]) parameter(0)
  %i = s32[] get-tuple-element(%t), index=0
  %limit = s32[] constant(3)
  ROOT %lt = pred[] compare(%i, %limit), direction=LT
}

%step_body (t: (s32[])) -> (s32[]) {
  %t = (s32[]) parameter(0)
  %zero = s32[] constant(0)
  %init = (s32[]) tuple(%zero)
  ROOT %inner = (s32[]) while(%init), condition=%inner_cond, body=%inner_body
}

%step_cond (t: (s32[])) -> pred[] {
  %t = (s32[]) parameter(0)
  %i = s32[] get-tuple-element(%t), index=0
  %n = s32[] constant(7)
  ROOT %ne = pred[] compare(%i, %n), direction=NE
}

ENTRY %main (n: s32[]) -> (s32[]) {
  %n = s32[] parameter(0)
  %init = (s32[]) tuple(%n)
  ROOT %steps = (s32[]) while(%init), condition=%step_cond, body=%step_body
}
"""

# As XLA prints it (thunk ids, dependencies, then the kernel); "condition:" unindented.
OUTSIDE = """000: kCommandBuffer [source       | next=003 (1)] 
    001: kCopy         [source       | next=002 (1)] kCopy
    002: kCustomKernel [prev=001 (1) | sink        ] loop_fusion grid: [1, 1, 1] threads: [1, 1, 1]  shared_memory: 0 bytes
003: kWhile         [prev=000 (1) | sink        ]   
condition:
    004: kCustomKernel [source | sink] loop_compare_fusion grid: [1, 1, 1] threads: [1, 1, 1]  shared_memory: 0 bytes
  body:
    000: kCommandBuffer [source       | next=009 (1)] 
        005: kCustomKernel [source       | next=006 (1)] fusion_1 grid: [1, 1, 1] threads: [1, 1, 1]  shared_memory: 0 bytes
        006: kCustomKernel [prev=005 (1) | sink        ] fusion_2 grid: [1, 1, 1] threads: [1, 1, 1]  shared_memory: 0 bytes
    009: kWhile         [prev=000 (1) | next=012 (1)]       
condition:
        010: kCustomKernel [source | sink] wrapped_compare grid: [1, 1, 1] threads: [1, 1, 1]  shared_memory: 0 bytes
      body:
        011: kCustomKernel [source | sink] loop_add_fusion grid: [1, 1, 1] threads: [1, 1, 1]  shared_memory: 0 bytes
    012: kConditional   [prev=009 (1) | sink        ]       
      branch_0:
        013: kCustomKernel [source | sink] small grid: [1, 1, 1] threads: [1, 1, 1]  shared_memory: 0 bytes
      branch_1:
        014: kCustomKernel [source       | next=015 (1)] big_1 grid: [1, 1, 1] threads: [1, 1, 1]  shared_memory: 0 bytes
        015: kCustomKernel [prev=014 (1) | sink        ] big_2 grid: [1, 1, 1] threads: [1, 1, 1]  shared_memory: 0 bytes
"""

# The same program with WHILE and CONDITIONAL commands: one command buffer around everything.
INSIDE = "000: kCommandBuffer [source | sink] \n" + "\n".join(
    "    " + line for line in OUTSIDE.replace("000: kCommandBuffer", "016: kSequential").splitlines())

METADATA = """thunk_metadata {
  thunk_info {
    profile_annotation: "steps"
    thunk_id: 3
  }
  thunk_kind: "kWhile"
}
thunk_metadata {
  thunk_info {
    profile_annotation: "inner"
    thunk_id: 9
  }
  thunk_kind: "kWhile"
}
"""


def test_a_step_outside_command_buffers_syncs_for_each_loop_iteration_and_branch():
    module = hlo.parse(MODULE)
    step = launches.step_launches(module, "steps", OUTSIDE, METADATA)
    # The step loop's condition (1 kernel), its body's graph (2 kernels), the inner loop 3 times
    # (condition and body, 2 kernels, one predicate read each), the heavier branch (2 kernels).
    assert step == {"kernels_outside_command_buffers": 1 + 3 * 2 + 2,
                    "command_buffer_launches": 1, "kernels_in_command_buffers": 2,
                    "host_syncs": 1 + 3 + 1, "unknown": 0, "step_in_command_buffer": False}


def test_a_step_inside_a_command_buffer_launches_nothing_from_the_host():
    module = hlo.parse(MODULE)
    step = launches.step_launches(module, "steps", INSIDE, METADATA)
    assert step == {"kernels_outside_command_buffers": 0, "command_buffer_launches": 0,
                    "kernels_in_command_buffers": 1 + 2 + 3 * 2 + 2, "host_syncs": 0,
                    "unknown": 0, "step_in_command_buffer": True}
    assert launches.step_launches(module, "no_such_loop", INSIDE, METADATA) is None


def test_the_predicted_step_adds_each_launch_to_the_longer_of_bytes_and_flops():
    m = launches.TIME_MODEL
    step = {"kernels_outside_command_buffers": 2, "command_buffer_launches": 1,
            "kernels_in_command_buffers": 10, "host_syncs": 3}
    overhead = 12 * m["kernel"] + 2 * m["launch"] + m["graph"] + 3 * m["sync"]
    assert launches.predicted_step_seconds(4e9, 1e12, step, 12, 4e12, 1e15) == \
        pytest.approx(1e-3 + overhead)  # bytes: 1 ms, FLOPs 1 ms
    assert launches.predicted_step_seconds(4e9, 4e12, step, 12, 4e12, 1e15) == \
        pytest.approx(4e-3 + overhead)  # FLOP-bound
    assert launches.predicted_step_seconds(4e9, 4e12, None, 12, 4e12, None) == \
        pytest.approx(1e-3 + 12 * (m["kernel"] + m["launch"]))  # no thunks, no matrix rate
    assert launches.predicted_step_seconds(4e9, 0, step, 12, None, None) is None


def test_a_kernel_of_few_programs_reads_at_their_rate_not_the_bandwidth():
    """A Pallas GPU kernel's runs (bytes, programs): below the bandwidth, their bytes take
    bytes / (programs x TIME_MODEL's per-program rate); the step's bytes already count them at
    the bandwidth, so only the difference is added. At or above the bandwidth, nothing."""
    rate = launches.TIME_MODEL["program"]
    bandwidth = 40 * rate
    few = ((4e8, 8), (2e8, 8), (1e9, 128))  # two runs of 8 programs, one of 128 (> 40)
    extra = 6e8 / (8 * rate) - 6e8 / bandwidth
    assert launches.few_programs_seconds(few, bandwidth) == pytest.approx(extra)
    assert launches.few_programs_seconds((), bandwidth) == 0
    assert launches.predicted_step_seconds(
        4e9, 0, None, 0, bandwidth, None, launches.few_programs_seconds(few, bandwidth)) == \
        pytest.approx(4e9 / bandwidth + extra)
    module = hlo.parse(MODULE)
    assert hlo.program_cost(module).few_programs == ()  # no kernel states its programs


def test_graphs_put_loops_and_branches_in_command_buffers_on_a_gpu_only(monkeypatch):
    monkeypatch.delenv("XLA_FLAGS", raising=False)
    # The engine's own options: XLA's defaults everywhere.
    assert compiler_options("cpu") == {} and compiler_options("gpu") == {}
    assert compiler_options("cpu", graphs=True) == {} and compiler_options("tpu", graphs=True) == {}
    options = compiler_options("gpu", graphs=True)
    assert set(options["xla_gpu_enable_command_buffer"].split(",")) == set(GPU_COMMAND_TYPES)
    assert {"WHILE", "CONDITIONAL", "FUSION", "CUSTOM_CALL"} <= set(GPU_COMMAND_TYPES)
    # The environment's own setting decides.
    monkeypatch.setenv("XLA_FLAGS", "--xla_gpu_enable_command_buffer=FUSION")
    assert compiler_options("gpu", graphs=True) == {}
