"""The rank's runtime services: fail-fast abort, the status board and watchdog, fault
hooks, MPI helpers (one node?, back-off), and the rank's own state object."""
