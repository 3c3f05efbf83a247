"""benchmarks/loss_memory.py's ratio lines: a ratio without a baseline prints n/a."""

from benchmarks import loss_memory


def test_loss_memory_ratios_say_n_a_where_the_peer_moved_nothing(capsys):
    same = {"rss_mb": 10.0, "rss_inputs_mb": 10.0, "secs": 1.0}
    results = {("chunked", 64): same, ("naive", 64): dict(same, secs=2.0)}
    loss_memory._ratios(64, results)
    out = capsys.readouterr().out
    assert out == "  T=64: chunked/naive  peak RSS 1.000  RSS above inputs n/a  time 0.500\n"
