import sys, torch
from triton.testing import do_bench
import neptune_fusion as nf
from neptune_fusion.bench.chains import CHAINS, make_inputs
chain = CHAINS["softmax"]
(x,) = make_inputs(chain, chain.sizes, torch.bfloat16, "cuda")
x.requires_grad_()
cot = torch.randn(x.shape, device="cuda", dtype=torch.bfloat16)
for dyn in (False, None, True):
    torch._dynamo.reset()
    g = nf.jit(chain.plain, dynamic=dyn)
    def step():
        x.grad = None
        g(x).backward(cot)
    step(); step()
    ms = do_bench(step, return_mode="median")
    fw = do_bench(lambda: g(x), return_mode="median")
    print(f"== dynamic={dyn}: step {ms:.3f} ms, forward with grad {fw:.3f} ms", flush=True)
    for r in g.backend.reports:
        for f in r.fused:
            print("outputs", f.outputs)
            for kk in f.kernel.kernels():
                print("schedule", getattr(kk, "schedule", None))
                with open(f"{sys.argv[1]}/src_{dyn}.py", "w") as fh:
                    fh.write(kk.source if isinstance(kk.source, str) else str(kk.source))
