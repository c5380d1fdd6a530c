"""The plan's reading of an optimized program: loops counted as often as they run, the heaviest
branch of a switch, kernels and the bytes of their operands and results."""

from alodlm_jax.plan import hlo

MODULE = """HloModule jit_f, entry_computation_layout={(bf16[1024,1024]{1,0}, s32[])->bf16[8,1024]{1,0}}

%fused_dot (p0: bf16[8,1024], p1: bf16[1024,1024]) -> bf16[8,1024] {
  %p0 = bf16[8,1024]{1,0} parameter(0)
  %p1 = bf16[1024,1024]{1,0} parameter(1)
  ROOT %dot = bf16[8,1024]{1,0} dot(%p0, %p1), lhs_contracting_dims={1}, rhs_contracting_dims={0}
}

%small (a: bf16[8,1024]) -> bf16[8,1024] {
  %a = bf16[8,1024]{1,0} parameter(0)
  ROOT %neg = bf16[8,1024]{1,0} negate(%a)
}

%big (b: bf16[8,1024]) -> bf16[8,1024] {
  %b = bf16[8,1024]{1,0} parameter(0)
  %n1 = bf16[8,1024]{1,0} negate(%b)
  ROOT %n2 = bf16[8,1024]{1,0} negate(%n1)
}

%layers_body (t: (s32[], bf16[8,1024], bf16[1024,1024])) -> (s32[], bf16[8,1024], bf16[1024,1024]) {
  %t = (s32[], bf16[8,1024]{1,0}, bf16[1024,1024]{1,0}) parameter(0)
  %i = s32[] get-tuple-element(%t), index=0
  %x = bf16[8,1024]{1,0} get-tuple-element(%t), index=1
  %w = bf16[1024,1024]{1,0} get-tuple-element(%t), index=2
  %f = bf16[8,1024]{1,0} fusion(%x, %w), kind=kOutput, calls=%fused_dot
  %one = s32[] constant(1)
  %j = s32[] add(%i, %one)
  ROOT %r = (s32[], bf16[8,1024]{1,0}, bf16[1024,1024]{1,0}) tuple(%j, %f, %w)
}

%layers_cond (t: (s32[], bf16[8,1024], bf16[1024,1024])) -> pred[] {
  %t = (s32[], bf16[8,1024]{1,0}, bf16[1024,1024]{1,0}) parameter(0)
  %i = s32[] get-tuple-element(%t), index=0
  %limit = s32[] constant(28)
  ROOT %lt = pred[] compare(%i, %limit), direction=LT
}

%step_body (t: (s32[], bf16[8,1024], bf16[1024,1024], s32[])) -> (s32[], bf16[8,1024], bf16[1024,1024], s32[]) {
  %t = (s32[], bf16[8,1024]{1,0}, bf16[1024,1024]{1,0}, s32[]) parameter(0)
  %x = bf16[8,1024]{1,0} get-tuple-element(%t), index=1
  %w = bf16[1024,1024]{1,0} get-tuple-element(%t), index=2
  %zero = s32[] constant(0)
  %start = s32[] copy(%zero)
  %inner = (s32[], bf16[8,1024]{1,0}, bf16[1024,1024]{1,0}) tuple(%start, %x, %w)
  %loop = (s32[], bf16[8,1024]{1,0}, bf16[1024,1024]{1,0}) while(%inner), condition=%layers_cond, body=%layers_body
  %y = bf16[8,1024]{1,0} get-tuple-element(%loop), index=1
  %k = s32[] get-tuple-element(%t), index=3
  %c = bf16[8,1024]{1,0} conditional(%k, %y, %y), branch_computations={%small, %big}
  %i = s32[] get-tuple-element(%t), index=0
  ROOT %r = (s32[], bf16[8,1024]{1,0}, bf16[1024,1024]{1,0}, s32[]) tuple(%i, %c, %w, %k)
}

%step_cond (t: (s32[], bf16[8,1024], bf16[1024,1024], s32[])) -> pred[] {
  %t = (s32[], bf16[8,1024]{1,0}, bf16[1024,1024]{1,0}, s32[]) parameter(0)
  %i = s32[] get-tuple-element(%t), index=0
  %k = s32[] get-tuple-element(%t), index=3
  ROOT %lt = pred[] compare(%i, %k), direction=LT
}

ENTRY %main (w: bf16[1024,1024], n: s32[]) -> bf16[8,1024] {
  %w = bf16[1024,1024]{1,0} parameter(0)
  %n = s32[] parameter(1)
  %x0 = bf16[8,1024]{1,0} broadcast(%n), dimensions={}
  %z = s32[] constant(0)
  %init = (s32[], bf16[8,1024]{1,0}, bf16[1024,1024]{1,0}, s32[]) tuple(%z, %x0, %w, %n)
  %steps = (s32[], bf16[8,1024]{1,0}, bf16[1024,1024]{1,0}, s32[]) while(%init), condition=%step_cond, body=%step_body
  ROOT %out = bf16[8,1024]{1,0} get-tuple-element(%steps), index=1
}
"""

ACT = 8 * 1024 * 2  # bytes of one bf16[8,1024]
WEIGHT = 1024 * 1024 * 2


def test_a_step_counts_its_inner_loop_as_often_as_it_runs_and_the_heaviest_branch():
    module = hlo.parse(MODULE)
    step = hlo.step_cost(module)
    # 28 times the layer body and condition (the fusion: activation and weight in, activation
    # out; the counter's add: 3 scalars; its compare: 2 scalars, a predicate), the heavier branch
    # (two negations), the copy of the counter's start, the step condition's compare.
    assert step.kernels == 28 * 3 + 2 + 1 + 1
    assert step.bytes == 28 * (2 * ACT + WEIGHT + 12 + 9) + 2 * (2 * ACT) + 8 + 9
    assert step.unknown == 0


def test_the_whole_program_counts_a_loop_of_unknown_trip_count_once_and_says_so():
    module = hlo.parse(MODULE)
    whole = hlo.program_cost(module)
    assert whole.unknown == 1
    assert whole.kernels == hlo.step_cost(module).kernels + 1  # the broadcast
    assert hlo.step_cost(module, depth=2) is None  # the layer loop has a known count: no step


def test_fusions_are_counted_in_the_program_text():
    assert hlo.count_fusions(MODULE) == 1


UPDATES = """HloModule jit_g

%write (buf: bf16[64,1024,128], rows: bf16[1,16,128], at: s32[]) -> bf16[64,1024,128] {
  %buf = bf16[64,1024,128]{2,1,0} parameter(0)
  %rows = bf16[1,16,128]{2,1,0} parameter(1)
  %at = s32[] parameter(2)
  %zero = s32[] constant(0)
  ROOT %dus = bf16[64,1024,128]{2,1,0} dynamic-update-slice(%buf, %rows, %at, %zero, %zero)
}

%read (buf: bf16[64,1024,128], at: s32[]) -> f32[1,1024,128] {
  %buf = bf16[64,1024,128]{2,1,0} parameter(0)
  %at = s32[] parameter(1)
  %zero = s32[] constant(0)
  %ds = bf16[1,1024,128]{2,1,0} dynamic-slice(%buf, %at, %zero, %zero), dynamic_slice_sizes={1,1024,128}
  ROOT %up = f32[1,1024,128]{2,1,0} convert(%ds)
}

%whole (buf: bf16[64,1024,128]) -> f32[64,1024,128] {
  %buf = bf16[64,1024,128]{2,1,0} parameter(0)
  ROOT %up = f32[64,1024,128]{2,1,0} convert(%buf)
}

ENTRY %main (buf: bf16[64,1024,128], rows: bf16[1,16,128], at: s32[]) -> (bf16[64,1024,128], f32[1,1024,128], f32[64,1024,128]) {
  %buf = bf16[64,1024,128]{2,1,0} parameter(0)
  %rows = bf16[1,16,128]{2,1,0} parameter(1)
  %at = s32[] parameter(2)
  %w = bf16[64,1024,128]{2,1,0} fusion(%buf, %rows, %at), kind=kLoop, calls=%write
  %r = f32[1,1024,128]{2,1,0} fusion(%w, %at), kind=kLoop, calls=%read
  %a = f32[64,1024,128]{2,1,0} fusion(%w), kind=kLoop, calls=%whole
  ROOT %t = (bf16[64,1024,128]{2,1,0}, f32[1,1024,128]{2,1,0}, f32[64,1024,128]{2,1,0}) tuple(%w, %r, %a)
}
"""


def test_an_in_place_update_is_charged_its_rows_and_a_slice_its_slice():
    module = hlo.parse(UPDATES)
    entry = module.entry
    by_name = entry.by_name
    rows, index = 16 * 128 * 2, 4
    buffer = 64 * 1024 * 128 * 2
    # The cache write reads and writes the 16 rows (and its index), not the 16 MiB buffer.
    assert module.kernel_bytes(entry, by_name["w"]) == rows + index + rows
    # The read of one slot's 1024 rows: the slice, then its f32 result.
    assert module.kernel_bytes(entry, by_name["r"]) == 1024 * 128 * 2 + index + 1024 * 128 * 4
    # A kernel that reads the whole buffer is charged all of it.
    assert module.kernel_bytes(entry, by_name["a"]) == buffer + 2 * buffer
    assert hlo.program_cost(module) == hlo.Cost(kernels=3, bytes=(2 * rows + index)
                                                + (1024 * 128 * 6 + index) + 3 * buffer)


NESTED = """HloModule jit_h

%pick (cache: bf16[28,4,256,128], at: s32[]) -> bf16[256,128] {
  %cache = bf16[28,4,256,128]{3,2,1,0} parameter(0)
  %at = s32[] parameter(1)
  %zero = s32[] constant(0)
  %ds = bf16[1,1,256,128]{3,2,1,0} dynamic-slice(%cache, %at, %zero, %zero, %zero), dynamic_slice_sizes={1,1,256,128}
  ROOT %flat = bf16[256,128]{1,0} bitcast(%ds)
}

%attend (q: bf16[8,128], cache: bf16[28,4,256,128], at: s32[]) -> f32[8,256] {
  %q = bf16[8,128]{1,0} parameter(0)
  %cache = bf16[28,4,256,128]{3,2,1,0} parameter(1)
  %at = s32[] parameter(2)
  %k = bf16[256,128]{1,0} fusion(%cache, %at), kind=kLoop, calls=%pick
  ROOT %s = f32[8,256]{1,0} dot(%q, %k), lhs_contracting_dims={1}, rhs_contracting_dims={1}
}

ENTRY %main (q: bf16[8,128], cache: bf16[28,4,256,128], at: s32[], w: bf16[128,128]) -> (f32[8,256], bf16[128,128]) {
  %q = bf16[8,128]{1,0} parameter(0)
  %cache = bf16[28,4,256,128]{3,2,1,0} parameter(1)
  %at = s32[] parameter(2)
  %w = bf16[128,128]{1,0:T(8,128)(2,1)} parameter(3)
  %s = f32[8,256]{1,0} fusion(%q, %cache, %at), kind=kOutput, calls=%attend
  %prefetch = (bf16[128,128]{1,0:T(8,128)(2,1)S(1)}, bf16[128,128]{1,0:T(8,128)(2,1)}, u32[]{:S(2)}) copy-start(%w)
  %on_chip = bf16[128,128]{1,0:T(8,128)(2,1)S(1)} copy-done(%prefetch)
  ROOT %t = (f32[8,256]{1,0}, bf16[128,128]{1,0:T(8,128)(2,1)S(1)}) tuple(%s, %on_chip)
}
"""


def test_a_slice_inside_a_nested_fusion_and_a_copy_to_on_chip_memory():
    module = hlo.parse(NESTED)
    entry = module.entry
    # The attention reads q, one layer and depth of the cache (through the nested fusion), the
    # index, and writes its scores: not the 28 x 4 slots of the whole cache.
    assert module.kernel_bytes(entry, entry.by_name["s"]) == 8 * 128 * 2 + 256 * 128 * 2 + 4 + 8 * 256 * 4
    # A prefetch into on-chip memory (S(1)) reads the weight from device memory once; its result
    # holds the copy on chip, the source (an alias, no traffic) and a context (S(2)): no more.
    assert module.kernel_bytes(entry, entry.by_name["prefetch"]) == 128 * 128 * 2


KERNEL = """HloModule jit_k

ENTRY %main (q: bf16[2,2,32,128], cache: bf16[2,28,4,512,2,128], at: s32[2]) -> (bf16[2,2,32,128], bf16[2,2,32,128]) {
  %q = bf16[2,2,32,128]{3,2,1,0} parameter(0)
  %cache = bf16[2,28,4,512,2,128]{5,4,3,2,1,0} parameter(1)
  %at = s32[2]{0} parameter(2)
  %pallas = bf16[2,2,32,128]{3,2,1,0} custom-call(%at, %q, %cache), custom_call_target="tpu_custom_call", backend_config={"flag_configs":[],"custom_call_config":{"body":"TUzvUg","cost_estimate":{"flops":"1024","transcendentals":"64","bytes_accessed":"1048576","remote_bytes_transferred":"0"},"needs_layout_passes":true}}
  %other = bf16[2,2,32,128]{3,2,1,0} custom-call(%q, %cache), custom_call_target="something_else"
  ROOT %t = (bf16[2,2,32,128]{3,2,1,0}, bf16[2,2,32,128]{3,2,1,0}) tuple(%pallas, %other)
}
"""


def test_a_pallas_kernel_is_charged_its_own_estimate_other_custom_calls_their_operands():
    module = hlo.parse(KERNEL)
    entry = module.entry
    q = 2 * 2 * 32 * 128 * 2
    cache = 2 * 28 * 4 * 512 * 2 * 128 * 2
    # The kernel reads one depth of each request's cache, not the buffer it is handed.
    assert module.kernel_bytes(entry, entry.by_name["pallas"]) == 1048576
    assert module.kernel_bytes(entry, entry.by_name["other"]) == q + cache + q
    # And its FLOPs (its scores and their products with V), which no dot in the program shows.
    assert module.kernel_flops(entry, entry.by_name["pallas"]) == 1024
    assert module.kernel_flops(entry, entry.by_name["other"]) == 0


TRITON_LOOP = r"""HloModule jit_t

%body (p: (s32[], bf16[8,128])) -> (s32[], bf16[8,128]) {
  %p = (s32[], bf16[8,128]{1,0}) parameter(0)
  %i = s32[] get-tuple-element(%p), index=0
  %x = bf16[8,128]{1,0} get-tuple-element(%p), index=1
  %triton = bf16[8,128]{1,0} custom-call(%x), custom_call_target="__gpu$xla.gpu.triton", backend_config={"name":"k","serialized_metadata = "{\22bytes_accessed\22: \22512\22, \22flops\22: \2264\22, \22programs\22: \228\22}"}
  %one = s32[] constant(1)
  %next = s32[] add(%i, %one)
  ROOT %t = (s32[], bf16[8,128]{1,0}) tuple(%next, %triton)
}

%cond (p: (s32[], bf16[8,128])) -> pred[] {
  %p = (s32[], bf16[8,128]{1,0}) parameter(0)
  %i = s32[] get-tuple-element(%p), index=0
  %n = s32[] constant(3)
  ROOT %lt = pred[] compare(%i, %n), direction=LT
}

ENTRY %main (x: bf16[8,128]) -> (s32[], bf16[8,128]) {
  %x = bf16[8,128]{1,0} parameter(0)
  %zero = s32[] constant(0)
  %init = (s32[], bf16[8,128]{1,0}) tuple(%zero, %x)
  ROOT %loop = (s32[], bf16[8,128]{1,0}) while(%init), condition=%cond, body=%body
}
"""


def test_a_gpu_kernel_states_its_programs_and_a_loop_counts_its_runs():
    """A Triton kernel's metadata gives its bytes, FLOPs and programs (its grid); run 3 times by
    a loop, its bytes at 8 programs are 3 runs' (the plan's few-programs term)."""
    cost = hlo.program_cost(hlo.parse(TRITON_LOOP))
    assert cost.flops == 3 * 64  # the loop's add and compare (scalars) do no products
    assert cost.few_programs == ((3 * 512, 8),)  # nor state programs


def test_a_step_counts_the_flops_of_its_products_as_often_as_they_run():
    step = hlo.step_cost(hlo.parse(MODULE))
    assert step.flops == 28 * 2 * 8 * 1024 * 1024  # the layer loop's fused dot, 28 times
    assert hlo.step_loop(hlo.parse(MODULE)).name == "steps"
