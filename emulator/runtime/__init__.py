"""The rank's runtime services: fail-fast abort, the status board and watchdog, fault
hooks, and the rank's own state object (the MPI helpers every layer shares, one
node? and back-off, are in ``devices/mpiutil.py``)."""
