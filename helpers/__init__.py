"""Helpers for the course "Training PyTorch models on GPUs, and making them fast".

The notebooks show each technique in plain PyTorch; these modules only hide measuring,
plotting and widget plumbing. One module per concern, listed by the chapter that
introduces it. The ground floor, which imports nothing from the course and which every other
module may use (tests/test_helpers_layout.py keeps the imports free of cycles):

- ``helpers.units``: ``MiB``, ``GiB``, ``format_bytes``, ``format_seconds``, and ``Printed``
  (results that Jupyter shows as their text)
- ``helpers.validate``: ``positive_int``, ``positive_seconds``, ``DeviceError`` (clear errors
  for bad input)
- ``helpers.models``: ``make_mlp``, ``wide_mlp_sizes``, the one MLP of every chapter and script

Chapter 1, devices
- ``helpers.devices``: choosing, checking and describing a device
- ``helpers.dtypes``: the dtype vocabulary ('bf16' <-> ``torch.bfloat16``)
- ``helpers.peaks``: the datasheet peak table (dense FLOP/s by GPU and precision, cited)
- ``helpers.timing``: the one benchmark function every chapter uses
- ``helpers.machine_state``: what else the machine was doing while a timing ran (GPU
  co-tenants, other processes' CPU use, threads)
- ``helpers.verdicts``: verdicts that compare exactly the table rows they name
- ``helpers.memory``: memory readouts and peak tracking
- ``helpers.nvml_snapshot``: a one-shot NVML reading through nvidia-ml-py
- ``helpers.sweeps``: out-of-memory-safe sweeps that collect a table
- ``helpers.tables`` and ``helpers.plots``: text tables and matplotlib figures
- ``helpers.widgets``: ipywidgets controls in front of a sweep function
- ``helpers.checks``: the exercise-check framework, with one module per chapter
- ``helpers.matmul``: the matmul size sweep

Chapter 2, the training loop
- ``helpers.data``: the sources' synthetic task, made in code
- ``helpers.syncs``: counting host syncs on any device
- ``helpers.batching``: device-resident batches, samplers, a slow dataset
- ``helpers.loops``: the sources' loop and the fast loop, flat parameters + FlatAdam, threads,
  timing, and ``same_but_for`` (two runs equal once a measured effect is removed: ``adam_pair``
  measures capturable Adam's, or MPS fused Adam's, float32 bias corrections)
- ``helpers.throughput``: the batch-size sweep, its plot and widget

Chapter 3, mixed precision
- ``helpers.formats``: number formats (the finfo table, fp16's range) and precision names
- ``helpers.amp_choice``: the autocast dtype by hardware, and probes that it runs here
- ``helpers.amp_sweep``: the fp32-vs-TF32-vs-AMP training-step sweep, its plot, widget and
  verdicts; TF32's matmul speed-up; AMP's final loss against fp32's seed-to-seed spread

Chapter 4, multi-GPU
- ``helpers.launch``: launching torchrun scripts from a notebook, safely, loopback only
- ``helpers.processes``: the job's processes and sockets, and stopping them all
- ``helpers.scaling_sweep``: throughput against the number of processes, in one launch
- ``helpers.scripts``: the distributed programs the chapter launches; ``one_launch.py`` runs
  several of them in one launch

Chapter 5, memory
- ``helpers.activations``: the saved-tensor activation meter, the layer-by-layer count, and
  checkpointing's cost (bytes, FLOPs, time)
- ``helpers.memory_bill``: the training memory bill, predicted and measured, and the GPU
  memory outside PyTorch's allocator (CUDA context, other processes)
- ``helpers.max_batch``: surviving out-of-memory, and the largest batch that fits

Chapter 6, profiling
- ``helpers.profiling``: profiler plumbing and a bottleneck diagnosis
- ``helpers.case_study``: the deliberately slow loop and its fixes
- ``helpers.sampler``: a background thread sampling the GPUs (or the process) during a run
- ``helpers.mfu``: model FLOPs utilisation

Chapter 7, capstone
- ``helpers.gpt``: a small GPT (decoder-only transformer) and the text it trains on
- ``helpers.capstone``: the training regime, the levers switched on one at a time and then
  ablated from the final configuration, measured into one table
- ``helpers.same_math``: loss curves compared step by step against the device's noise floor
- ``helpers.fp8``: FP8 training through torchao (optional), and the FP8 datasheet peaks
- ``helpers.step_profile``: a profiled step in buckets, and what would cut the largest left

Chapter 8, build it yourself
- ``helpers.flash_attention``: online softmax, the FlashAttention-2 forward and its backward
  by recomputation, in plain PyTorch
- ``helpers.attention_tiles``: the rounding bound the attention checks use, and saved bytes
  against the sequence length
- ``helpers.attention_errors``: judging a kernel as FlashAttention's tests do (its error
  against float64, against PyTorch's in the same dtype), and the gallery of planted bugs
- ``helpers.attention_triton``: the same forward and its backward as Triton kernels (compiled
  on a GPU, interpreted on a CPU), and whether Triton can run here
- ``helpers.attention_timing``: SDPA, the tiles, the written-out attention and Triton timed
  side by side, with their memory; forward and backward timed for training
- ``helpers.comm_overlap``: spans of communication against compute, gradient buckets, a
  ring's bytes on the wire, the alpha-beta fit, flat-vector shards, ranges labelled for the
  profiler and NVTX, the Nsight Systems command with its capture range
- ``helpers.dp_by_hand``: reading the data-parallel runs: the gradients' rounding bound,
  tables, the overlap plot, a profiler trace read back
- ``helpers.sharding``: ZeRO and FSDP measured: live tensor bytes per rank (the CUDA allocator,
  else a dispatch mode), the ZeRO paper's per-rank formulas, a ring's bytes on the wire
- ``helpers.scripts``: ``dp_by_hand.py`` (four ways against DDP), ``zero1_by_hand.py``,
  ``fsdp_by_hand.py``, and ``ch08_exercise_check.py`` for the exercise checks
"""

__version__ = "0.1.0"
