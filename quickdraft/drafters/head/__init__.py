"""The `head` drafter and everything it runs on: the head's model (`model.py`), its files on disk
(`files.py`), the check that binds it to its target (`identity.py`), its inference form on a
CPU (`inference.py`) and the drafter itself (`drafter.py`). Training (`quickdraft.distill`) builds on
these; nothing here imports the training code."""
