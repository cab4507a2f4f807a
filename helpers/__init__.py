"""Helpers for the course "Training PyTorch models on GPUs, and making them fast".

The notebooks show each technique in plain PyTorch; these modules only hide measuring,
plotting and widget plumbing. One module per concern:

- ``helpers.devices``: choosing and describing a device (chapter 1)
- ``helpers.timing``: the one benchmark function every chapter uses (chapter 1)
- ``helpers.memory``: memory readouts and peak tracking (chapter 1)
- ``helpers.gpu_monitor``: NVML snapshots through nvidia-ml-py (chapter 1)
- ``helpers.sweeps``: out-of-memory-safe sweeps that collect a table (chapter 1)
- ``helpers.plots``: small matplotlib helpers (chapter 1)
- ``helpers.widgets``: ipywidgets controls in front of a sweep function (chapter 1)
- ``helpers.checks``: the exercise-check framework, one module per chapter (chapter 1)
"""

__version__ = "0.1.0"
