"""Files as the tests compare them."""


def snapshot(folder) -> dict[str, bytes]:
    """Every file under ``folder`` (hidden ones too) with its bytes: what "nothing was changed" is
    checked against."""
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}
