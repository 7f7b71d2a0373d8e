"""What a text file that is not UTF-8 is, for error lines that name its encoding and the command that converts it.

UTF-16 and UTF-32 are told by their byte-order mark, or without one by the NUL bytes their ASCII characters
carry, all on one side of each 2- or 4-byte unit (a binary file has them anywhere). An 8-bit file is a guess,
made honestly: GBK when its high bytes come in pairs and decode to Chinese, Windows-1252/Latin-1 when they
stand alone among ASCII letters (Western text: café, Müller), UTF-8 with a damaged byte when the rest is UTF-8.
"""

from __future__ import annotations

import codecs
from pathlib import Path

# (byte-order mark, Python codec, iconv's name); UTF-32LE's mark begins with UTF-16LE's, so it comes first.
BOMS = (
    (b"\xff\xfe\x00\x00", "utf-32-le", "UTF-32LE"),
    (b"\x00\x00\xfe\xff", "utf-32-be", "UTF-32BE"),
    (b"\xff\xfe", "utf-16-le", "UTF-16LE"),
    (b"\xfe\xff", "utf-16-be", "UTF-16BE"),
)
UTF8_BOM = b"\xef\xbb\xbf"
_SAMPLE = 1 << 16  # bytes looked at to guess an encoding


def wide_bom(head: bytes) -> tuple[str, str, int] | None:
    """(codec, iconv name, mark length) of a UTF-16/UTF-32 byte-order mark at the start of ``head``."""
    for bom, codec, name in BOMS:
        if head.startswith(bom):
            return codec, name, len(bom)
    return None


def _looks_like_text(text: str) -> bool:
    shown = sum(c.isprintable() or c in "\t\n\r\f" for c in text)
    return bool(text) and "\0" not in text and shown >= 0.95 * len(text)


def wide_without_bom(head: bytes) -> str | None:
    """The iconv name of UTF-32 or UTF-16 text without a byte-order mark (``head``: the file's first bytes),
    or None: its NULs are the zero halves of ASCII characters, all at the same place in each unit."""
    head = head[:_SAMPLE]
    for codec, name in (("utf-32-le", "UTF-32LE"), ("utf-32-be", "UTF-32BE")):
        try:
            if _looks_like_text(codecs.getincrementaldecoder(codec)().decode(head, final=False)):
                return name
        except UnicodeDecodeError:
            pass
    even, odd = head[0::2].count(0), head[1::2].count(0)
    units = len(head) // 2
    for codec, name, zeros, others in (("utf-16-le", "UTF-16LE", odd, even), ("utf-16-be", "UTF-16BE", even, odd)):
        if units and zeros >= 0.2 * units and others <= 0.01 * units:
            try:
                if _looks_like_text(codecs.getincrementaldecoder(codec)().decode(head, final=False)):
                    return name
            except UnicodeDecodeError:
                pass
    return None


def guess_8bit(data: bytes) -> tuple[str, str] | None:
    """(iconv name, description) of what bytes that are not UTF-8 most likely are ('' for a name: one of
    several), or None when there is no good guess. ``data``: some of the file around where UTF-8 failed."""
    data = data[:_SAMPLE]
    high = [i for i, b in enumerate(data) if b >= 0x80]
    if not high:
        return None
    damaged = data.decode("utf-8", errors="replace").count("\ufffd")
    if damaged * 10 <= len(high) and damaged < len(high):  # nearly all of it decodes: UTF-8 with damage
        return "UTF-8", "UTF-8 with damaged bytes"
    paired = sum((i > 0 and data[i - 1] >= 0x80) or (i + 1 < len(data) and data[i + 1] >= 0x80) for i in high)
    if paired >= 0.9 * len(high):  # double-byte characters, as Chinese, Japanese and Korean encodings have
        text = data.decode("gbk", errors="replace")  # the sample may cut a character at either end
        wide = [c for c in text if ord(c) >= 0x80]
        chinese = sum("\u4e00" <= c <= "\u9fff" or "\u3000" <= c <= "\u303f" or "\uff00" <= c <= "\uffef" for c in wide)
        if wide and text.count("\ufffd") <= 2 and chinese >= 0.9 * len(wide):
            return "GBK", "GBK (Chinese)"
        return "", "a double-byte East Asian encoding (Big5, EUC-KR?)"
    # Shift-JIS's second bytes may be ASCII: told by its kana (Western bytes make half-width ones, never these)
    text = data.decode("shift_jis", errors="replace")
    wide = [c for c in text if ord(c) >= 0x80]
    kana = sum("\u3040" <= c <= "\u30ff" for c in wide)
    japanese = kana + sum(
        "\u4e00" <= c <= "\u9fff" or "\u3000" <= c <= "\u303f" or "\uff01" <= c <= "\uff5e" for c in wide
    )
    if kana and text.count("\ufffd") <= 2 and japanese >= 0.9 * len(wide):
        return "SHIFT_JIS", "Shift-JIS (Japanese)"
    try:
        data.decode("cp1252")
    except UnicodeDecodeError:
        return None
    if any(0x80 <= b <= 0x9F for b in data):  # Windows-1252's curly quotes and dashes; control codes in Latin-1
        return "CP1252", "Windows-1252 (Western European)"
    return "LATIN1", "Latin-1 (ISO-8859-1)"


def convert_hint(path: Path | str, name: str) -> str:
    """The command that writes a UTF-8 copy of ``path`` (encoded in ``name``, iconv's spelling)."""
    path = Path(path)
    if path.name.lower().endswith((".gz", ".zst")):
        return f"decompress it and convert it to UTF-8 (iconv -f {name} -t UTF-8)"
    return f"convert it: iconv -f {name} -t UTF-8 {path} > {path.with_name(path.stem + '.utf8' + path.suffix)}"


def not_utf8(data: bytes, start: int, path: Path | str) -> str:
    """What to say about bytes that are not UTF-8 (``start``: where decoding failed in ``data``): the
    encoding they look like and how to convert, or just to save the file as UTF-8."""
    guess = guess_8bit(data[max(0, start - _SAMPLE // 2) : start + _SAMPLE // 2])
    if guess is None:
        return "save it as UTF-8"
    name, description = guess
    if name == "UTF-8":
        return "the rest is UTF-8: a damaged byte? fix or remove it"
    return f"it looks like {description}: {convert_hint(path, name or 'ENCODING')}"


def decode_text(data: bytes, path: Path | str, what: str = "", marks: bool = True) -> str:
    """A whole file's text: UTF-8 (its byte-order mark dropped), or UTF-16/UTF-32 with a byte-order mark;
    anything else is a UserError naming the encoding it looks like and how to convert it (``what``: the
    file's role, said before its name). ``marks=False``: a byte-order mark is an error too (a vocab.txt is
    copied into checkpoints, whose readers take UTF-8 without one)."""
    from bertgpu.errors import UserError

    where = f"{what} {path}".strip()
    bom = wide_bom(data)
    if not marks and (bom is not None or data.startswith(UTF8_BOM)):
        if bom is None:
            raise UserError(
                f"{where} starts with a UTF-8 byte-order mark, which transformers reads as part of its first "
                "token: remove it"
            )
        raise UserError(f"{where} is {bom[1]} text, not UTF-8 (which transformers reads); {convert_hint(path, bom[1])}")
    if bom is not None:
        codec, name, length = bom
        try:
            return data[length:].decode(codec)
        except UnicodeDecodeError as e:
            raise UserError(
                f"{where}: not valid {name} at byte {e.start + length} (it starts with {name}'s mark)"
            ) from None
    data = data.removeprefix(UTF8_BOM)  # the byte-order mark spreadsheet programs write
    if b"\0" in data[:_SAMPLE] and (name := wide_without_bom(data)) is not None:
        raise UserError(f"{where}: {name} text without a byte-order mark, not UTF-8; {convert_hint(path, name)}")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data[: e.start].count(b"\n") + 1
        raise UserError(
            f"{where}:{line}: not valid UTF-8 (byte 0x{data[e.start]:02x} at byte offset {e.start}); "
            f"{not_utf8(data, e.start, path)}"
        ) from None
