"""Every output the docs show is the code's: each fenced ``console`` block of README.md and
docs/ is run as shown and its shown lines are found in what it prints (``doc_examples``:
the rules, and ``python -m tests.doc_examples --update`` after a change that moves them)."""

import pytest

from tests import doc_examples

EXAMPLES = doc_examples.examples()
DOCTESTS = doc_examples.doctests()


def test_the_docs_show_outputs_to_check():
    shown = {ex.path.rsplit("/", 1)[-1] for ex in EXAMPLES}
    assert {"README.md", "ficco.md", "flux.md", "fused-ops.md", "what-ifs.md",
            "t3.md"} <= shown
    assert DOCTESTS["docs/api.md"]


def test_a_changed_figure_is_found_and_an_abridged_line_is_not():
    printed = ["mode   modelled", "t3   1044.2 us   1.388x  gemm+rs 538.9   1.29s"]
    assert doc_examples.differences(["t3   1044.2 us   1.388x  gemm+rs 538.9   9.99s"],
                                    printed) == []  # wall time: this host's
    assert doc_examples.differences(["t3   1044.2 us   1.388x  ..."], printed) == []
    wrong = ["t3   1044.3 us   1.388x  gemm+rs 538.9   1.29s"]
    assert doc_examples.differences(wrong, printed) == wrong
    assert doc_examples.differences(["t3   1044.3 us ..."], printed) == ["t3   1044.3 us ..."]
    # the shown lines in order: one printed before its predecessor is not found
    assert doc_examples.differences(printed[::-1], printed) == [printed[0]]


@pytest.mark.parametrize("example", EXAMPLES,
                         ids=[f"{ex.path.rsplit('/', 1)[-1]}:{ex.line}" for ex in EXAMPLES])
def test_a_shown_output_is_what_the_command_prints(example, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # (an API example writes where it runs)
    example.evaluate()


@pytest.mark.parametrize("name", list(DOCTESTS))
def test_a_doctest_prints_what_the_doc_shows(name, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # (the API example writes its sweep where it runs)
    for example in DOCTESTS[name]:  # in order: one namespace
        example.evaluate()
