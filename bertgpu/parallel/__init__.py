"""How training is spread over processes: the one place in bertgpu that knows.

    launch.py       start local workers (torch's elastic launcher, the engine of torchrun) and join
                    the process group; a worker's errors become one line
    dims.py         ParallelDims: the degrees (pipeline, data and tensor parallel), checked against the
                    process count and the model, and the DeviceMesh they make
    layout.py       check_layout(): the degrees, precision and options that go together, or one line why not
    parallelize.py  parallelize(): tensor parallel -> activation checkpointing -> compile -> FSDP or
                    DDP, in torchtitan's order (or the pipeline's stages, with --pp)
    wrap.py         what parallelize() and the pipeline build with: SpreadOptions, ParallelModel (WholeModel
                    where every process runs the whole forward pass), each step applied per encoder layer,
                    gradient clipping over sharded gradients
    pipeline.py     --pp: pipeline stages cut from the model (Hugging Face names kept), each spread as
                    above, run by torch.distributed.pipelining's schedules; the tied embedding's two copies
    rng.py          every rank's dropout RNG streams, into a checkpoint and back

The training loops (bertgpu/tasks) call these and never wrap a model themselves; the model
(bertgpu/model.py) knows nothing of any of it. PyTorch's own stack does the work: DeviceMesh,
DTensor's ``parallelize_module``, FSDP2's ``fully_shard``, ``torch.distributed.pipelining``,
DistributedDataParallel and torch.distributed.checkpoint (in bertgpu/checkpoint.py).
"""

from bertgpu.parallel.dims import ParallelDims
from bertgpu.parallel.parallelize import parallelize
from bertgpu.parallel.wrap import ParallelModel, SpreadOptions, WholeModel

__all__ = ["ParallelDims", "ParallelModel", "SpreadOptions", "WholeModel", "parallelize"]
