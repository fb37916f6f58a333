"""Which device fields a run reads (``emulator/model/reads.py``): the causes split skips a
counterfactual step whose changed fields the run before it never read."""

import copy
import dataclasses
import pickle

import pytest

from devices.spec import load_device
from devices.system import load_system
from emulator.model import reads
from emulator.model.ablation import ablate, steps


def test_differences_are_the_leaf_fields_each_step_changes():
    spec = load_system("mi300x-x8")
    got = [reads.differences(spec, ablate(spec, s)) for s in steps()]
    assert got[0] == {("DeviceSpec", "launch_s")}
    assert got[1] == {("DeviceSpec", "launch_s"), ("InterconnectSpec", "library_latency")}
    assert ("GemmSpec", "enabled") in got[3]
    assert ("DramSpec", "shared") in got[-1]
    assert reads.differences(spec, spec) == set()


def test_a_watched_device_notes_only_its_watched_fields_and_reads_the_same_values():
    spec = load_system("mi300x-x8")
    fields = {("DeviceSpec", "launch_s"), ("InterconnectSpec", "library_latency"),
              ("ExecutorSpec", "copy_fraction"), ("DramSpec", "shared")}
    w = reads.watched(spec, fields)
    assert w == spec and spec == w and isinstance(w, type(spec))
    with reads.reading() as seen:
        got = (w.cus, w.interconnect.link_bw, w.dram.banks)
        assert got == (spec.cus, spec.interconnect.link_bw, spec.dram.banks)
    assert seen == set()  # fields nobody watches: no note
    with reads.reading() as seen:
        assert w.launch_s == spec.launch_s
        assert w.executors.fraction("copy", 0.5, False, 0.5) == spec.executors.copy_fraction
    assert seen == {("DeviceSpec", "launch_s"), ("ExecutorSpec", "copy_fraction")}
    with reads.reading() as seen:  # the library's own fraction reads no executor's
        w.executors.fraction("library", 0.5, False, 0.5)
    assert seen == set()
    w.launch_s  # outside a block: nothing noted, nothing raised
    with reads.reading() as seen:  # replace reads every field (a conservative note)
        r = dataclasses.replace(w, cus=1)
    assert seen == {("DeviceSpec", "launch_s")} and r.cus == 1
    with reads.reading() as seen:
        assert r.launch_s == spec.launch_s  # the copy is watched too
    assert seen == {("DeviceSpec", "launch_s")}


def test_a_watched_device_refuses_copies_whose_reads_would_go_unseen():
    w = reads.watched(load_device("mi300x"), {("DeviceSpec", "launch_s")})
    for make in (pickle.dumps, copy.copy, copy.deepcopy):
        with pytest.raises(TypeError, match="not copied or pickled"):
            make(w)
    with reads.reading(), pytest.raises(RuntimeError, match="already"):
        with reads.reading():
            pass


def test_an_unwatched_device_is_returned_as_it_is():
    spec = load_device("mi300x")
    assert reads.watched(spec, set()) is spec
    assert reads.watched(spec, {("Nothing", "x")}) is spec
