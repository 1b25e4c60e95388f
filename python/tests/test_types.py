"""The package's type hints, as a user's type checker sees them (mypy, where installed:
CI installs it). pinlane ships ``py.typed``; a batch comes back typed as it went in, as
spdl's ``T -> T``, and a wrong argument type is flagged."""

import importlib.resources
import textwrap

import pytest

USER_CODE = '''
import pinlane

batch = {"a": [1, 2]}
out = pinlane.transfer_tensor_h2d(batch)
reveal_type(out)
back = pinlane.transfer_tensor_d2h(out, device="cuda:0")
reveal_type(back)
for b in pinlane.prefetch([batch], depth=2):
    reveal_type(b)
reveal_type(pinlane.memory_stats())
pinlane.transfer_tensor_h2d(batch, num_caches="4")
'''


def test_the_package_is_marked_typed():
    assert importlib.resources.files("pinlane").joinpath("py.typed").is_file()


def test_a_users_type_checker_sees_the_batch_type_and_wrong_arguments(tmp_path):
    api = pytest.importorskip("mypy.api")
    path = tmp_path / "user_code.py"
    path.write_text(textwrap.dedent(USER_CODE))
    out, err, status = api.run(["--no-incremental", "--cache-dir", str(tmp_path / "cache"), str(path)])
    lines = [line.split(": ", 1)[1] for line in out.splitlines() if line.startswith(str(path))]
    assert lines[:5] == [
        'note: Revealed type is "dict[str, list[int]]"',
        'note: Revealed type is "dict[str, list[int]]"',
        'note: Revealed type is "dict[str, list[int]]"',
        'note: Revealed type is "dict[str, Any]"',
        'error: Argument "num_caches" to "transfer_tensor_h2d" has incompatible type "str"; expected "int"  [arg-type]',
    ], out + err
    assert len(lines) == 5 and status == 1, out + err
