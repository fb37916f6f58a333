"""The model: modelled time. Resources (timelines), every cost formula, arbitration
policies. Pure Python over the device spec: no MPI, no collectives, no application."""
