"""The application: command line, run configuration, launcher, the per-rank worker,
scenarios, sweeps, reports, traces and the emulator's own benchmark."""
