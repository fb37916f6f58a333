"""The emulator's machinery: rank runtime, address-space maps, modelled clock, CLI."""
