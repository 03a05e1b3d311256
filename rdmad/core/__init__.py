"""The core: the claim state machine and what only it uses. It imports the vocabulary
(rdmad.model, rdmad.errors, rdmad.options), itself and the standard library, nothing else:
the kernel, the bus and the disk reach it through its ports (rdmad.core.backend)."""
