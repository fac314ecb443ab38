"""commbench.units: every spelling of a rate, a size and a latency that a command takes,
the spelling tc gets, and one-line refusals naming the accepted forms."""

import pytest

from commbench import units
from commbench.errors import UsageError


@pytest.mark.parametrize("text,bits", [
    ("25gbit", 25e9),
    ("25Gbit/s", 25e9),
    ("25gbit/s", 25e9),
    ("25GBIT", 25e9),
    ("200mbit", 200e6),
    ("1gbit", 1e9),
    ("1.5gbit", 1.5e9),
    ("300kbit", 300e3),
    ("9600bit", 9600.0),
    ("1tbit", 1e12),
    ("25 gbit", 25e9),
    (" 10gbit ", 10e9),
    ("150GB/s", 150e9 * 8),
    ("150 GB/s", 150e9 * 8),
    ("10GB/s", 80e9),
    ("400MB/s", 3.2e9),
    ("1KB/s", 8e3),
    ("1kB/s", 8e3),
    ("2TB/s", 16e12),
    ("100B/s", 800.0),
])
def test_rates_in_bits_per_second(text, bits):
    assert units.rate_bits(text) == bits


@pytest.mark.parametrize("text", [
    "fast", "", "25", "0gbit", "0.0GB/s", "-1gbit", "25gbps", "25Gb/s", "25gb/s", "25 G",
    "25xbit", "gbit", "1,5gbit",
])
def test_bad_rates_are_one_line_naming_the_forms(text):
    with pytest.raises(UsageError) as refused:
        units.rate_bits(text, "--link")
    message = str(refused.value)
    assert "\n" not in message
    assert message.startswith(f"argument --link: {text!r} is not a rate")
    assert "25gbit" in message and "25Gbit/s" in message and "150GB/s" in message


@pytest.mark.parametrize("text,tc", [
    ("1gbit", "1gbit"),
    ("200mbit", "200mbit"),
    ("1.5gbit", "1.5gbit"),
    ("25Gbit/s", "25gbit"),
    ("25 gbit", "25gbit"),
    ("150GB/s", "1.2tbit"),
    ("1MB/s", "8mbit"),
    ("300kbit/s", "300kbit"),
])
def test_tc_gets_its_own_spelling(text, tc):
    assert units.tc_rate(text) == tc


@pytest.mark.parametrize("bits,text", [
    (200e6, "200mbit"), (1e9, "1gbit"), (1.5e9, "1.5gbit"), (2.4e9, "2.4gbit"),
    (64e3, "64kbit"), (500.0, "500bit"), (1.2e12, "1.2tbit"),
])
def test_rates_are_printed_as_tc_spells_them(bits, text):
    assert units.format_rate(bits) == text


@pytest.mark.parametrize("text,nbytes", [
    ("8", 8),
    ("1K", 1 << 10),
    ("4K", 4 << 10),
    ("4k", 4 << 10),
    ("64M", 64 << 20),
    ("256MB", 256 << 20),
    ("256mb", 256 << 20),
    ("1G", 1 << 30),
    ("1g", 1 << 30),
    ("16B", 16),
    (" 2 M ", 2 << 20),
])
def test_sizes_in_bytes_as_nccl_tests_reads_them(text, nbytes):
    assert units.size_bytes(text) == nbytes


@pytest.mark.parametrize("nbytes,text", [
    (8, "8"), (1536, "1.5K"), (64 << 20, "64M"), (2.67 * (1 << 30), "2.67G"),
    (1020 * (1 << 20), "1020M"), (999.7 * (1 << 20), "1000M"), (1000, "1000"),
    (4096 * (1 << 30), "4096G"),
])
def test_sizes_are_printed_in_figures_not_exponents(nbytes, text):
    assert units.format_bytes(nbytes) == text


@pytest.mark.parametrize("text", ["0", "-1", "12X", "", "1.5M", "1T", "M", "64MiB"])
def test_bad_sizes_are_one_line_naming_the_forms(text):
    with pytest.raises(UsageError) as refused:
        units.size_bytes(text, "-b/--minbytes")
    message = str(refused.value)
    assert "\n" not in message
    assert message == f"argument -b/--minbytes: {text!r} is not {units.SIZE_FORMS}"


@pytest.mark.parametrize("text,seconds", [
    ("5us", 5e-6), ("1.5ms", 1.5e-3), ("1s", 1.0), ("100ns", 1e-7), ("0", 0.0), (" 2 us", 2e-6),
])
def test_latencies_in_seconds(text, seconds):
    assert units.seconds(text, "--latency") == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["soon", "5", "5 min", ""])
def test_bad_latencies_are_one_line(text):
    with pytest.raises(UsageError, match=r"^argument --latency: .* is not a latency; write"):
        units.seconds(text, "--latency")
