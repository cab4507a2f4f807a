"""Programs the chapter 4 notebook launches with ``torchrun`` (chapter 4).

They are shipped inside the package, so that ``pip install git+...`` (Colab) has them too.
Find one with :func:`helpers.launch.script_path`; run one with
:func:`helpers.launch.launch`. Each also runs from a terminal::

    torchrun --standalone --nproc-per-node=2 helpers/scripts/manual_allreduce.py --out /tmp/x

:mod:`helpers.scripts.one_launch` runs several of them one after another in one launch, so
their start-up (torch imported by torchrun and by every rank) is paid once.
:mod:`helpers.scripts.common` holds what every script shares (process-group set-up,
rank-0 logging, writing results for the notebook to read back).
"""
