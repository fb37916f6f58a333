"""What an emulated GPU is: specs and presets, HBM, GEMM stage kernels, tracker, DMA engine."""
