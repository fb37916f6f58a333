"""Probe: does this MPI's MPI_Accumulate(SUM) on MPI_FLOAT16_T add fp16 values?"""

import numpy as np
from mpi4py import MPI

comm = MPI.COMM_WORLD
win = MPI.Win.Allocate_shared(8, 2, comm=comm)
a = np.frombuffer(win.Shared_query(comm.rank)[0], dtype=np.float16, count=4)
a[:] = 0
comm.Barrier()
win.Lock_all()
win.Accumulate([np.full(4, 0.5 + comm.rank, np.float16), MPI.FLOAT16_T], 0,
               target=[0, 4, MPI.FLOAT16_T], op=MPI.SUM)
win.Flush(0)
win.Unlock_all()
comm.Barrier()
if comm.rank == 0:
    print("native-fp16-sum" if a[0] == 0.5 * comm.size + sum(range(comm.size)) else
          f"broken-fp16-sum {a[0]}")
win.Free()
