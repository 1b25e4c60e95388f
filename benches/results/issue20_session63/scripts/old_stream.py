# Shown to fail (session 63): run from the project root with the carried wheels,
#   bash .gpu/with-python python3 benches/results/issue20_session63/scripts/old_stream.py
# First: the D2H copy_into stream test against the code before the
# fix (no stream context for strided/negated CUDA sources), by turning the fix off.
import pytest
import pinlane

pinlane._needs_a_copy = lambda *a: False
rc = pytest.main(["-q", "-p", "no:cacheprovider", "python/tests/test_copy_into_gpu.py",
                  "-k", "strided_and_negated_sources_after_their_producer"])
print("old code: pytest exit", int(rc))

# The torch pairs' wait (helper-41's finding 3): without `stream.wait_stream(current)`.
import torch
real = torch.cuda.Stream.wait_stream
torch.cuda.Stream.wait_stream = lambda self, other: None
rc = pytest.main(["-q", "-p", "no:cacheprovider", "python/tests/test_copy_into_gpu.py",
                  "-k", "copies_torchs_pairs_after_the_current_streams_work"])
torch.cuda.Stream.wait_stream = real
print("torch pairs without the wait: pytest exit", int(rc))
