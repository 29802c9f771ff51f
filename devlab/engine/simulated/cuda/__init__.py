"""CUDA's API as a program sees it, laid out as torch.cuda is: devices (`device_api`), random
state (`rng`), streams and events (`streams`), memory (`memory`), graphs (`graphs`), the
accelerator API (`accelerator`), autocast for "cuda" (`amp`), what a CUDA build has (`build`);
`namespaces` puts each stand-in where torch's name is. Imports `core`, `clock` and `mode`."""
