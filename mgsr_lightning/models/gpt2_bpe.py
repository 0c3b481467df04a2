"""GPT-2's own byte-level BPE (50,257 ids), built offline from the ``gpt2.tiktoken`` file that openai-whisper's
source distribution ships (MIT; byte-identical to GPT-2's vocabulary and merges).

    python -m pip download --no-deps --no-binary :all: openai-whisper==20250625 -d artifacts/downloads
    python -m mgsr_lightning.models.gpt2_bpe artifacts/downloads/openai_whisper-20250625.tar.gz artifacts/gpt2_bpe

(``make install-gpt2-bpe`` runs both.) The file lists each token's bytes (base64) with its rank;
``transformers``' ``TikTokenConverter`` turns ranks into GPT-2's vocabulary and merges. ``<|endoftext|>``
(id 50,256) is added as BOS, EOS and pad, as GPT-2's tokenizer has it.
"""

from __future__ import annotations

import argparse
import base64
import tarfile
import tempfile
from pathlib import Path

from transformers import PreTrainedTokenizerFast
from transformers.convert_slow_tokenizer import TikTokenConverter

ENDOFTEXT = "<|endoftext|>"
MEMBER = "whisper/assets/gpt2.tiktoken"  # inside the sdist's top folder


def read_ranks(path: str | Path) -> dict[bytes, int]:
    """``{token bytes: rank}`` from a ``.tiktoken`` file (one ``<base64 bytes> <rank>`` per line)."""
    ranks = {}
    for number, line in enumerate(Path(path).read_text().splitlines(), 1):
        if not line.strip():
            continue
        token, rank = line.split()
        if int(rank) != len(ranks):
            raise ValueError(f"{path}:{number}: rank {rank} out of order (expected {len(ranks)})")
        ranks[base64.b64decode(token)] = int(rank)
    return ranks


class _FileConverter(TikTokenConverter):
    """``TikTokenConverter`` reading the ranks itself (the ``tiktoken`` package is not needed)."""

    @staticmethod
    def load_tiktoken_bpe(tiktoken_url: str) -> dict[bytes, int]:
        return read_ranks(tiktoken_url)


def gpt2_tokenizer(tiktoken_file: str | Path, save_dir: str | Path | None = None) -> PreTrainedTokenizerFast:
    """GPT-2's tokenizer from ``gpt2.tiktoken``; saved with ``save_pretrained`` when ``save_dir`` is given."""
    converter = _FileConverter(vocab_file=str(tiktoken_file), extra_special_tokens=[ENDOFTEXT])
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=converter.converted(), bos_token=ENDOFTEXT,
                                        eos_token=ENDOFTEXT, pad_token=ENDOFTEXT, model_max_length=1024)
    if len(tokenizer) != 50257 or tokenizer.convert_tokens_to_ids(ENDOFTEXT) != 50256:
        raise ValueError(f"{tiktoken_file} is not GPT-2's vocabulary: {len(tokenizer)} ids, "
                         f"{ENDOFTEXT} at {tokenizer.convert_tokens_to_ids(ENDOFTEXT)}")
    if save_dir is not None:
        tokenizer.save_pretrained(save_dir)
    return tokenizer


def gpt2_tokenizer_from_sdist(sdist: str | Path, save_dir: str | Path) -> PreTrainedTokenizerFast:
    """GPT-2's tokenizer from openai-whisper's source archive (``*.tar.gz``), saved to ``save_dir``."""
    with tarfile.open(sdist) as archive, tempfile.TemporaryDirectory() as folder:
        members = [m for m in archive.getmembers() if m.name.endswith(MEMBER)]
        if not members:
            raise FileNotFoundError(f"{sdist} holds no {MEMBER}")
        path = Path(folder) / "gpt2.tiktoken"
        path.write_bytes(archive.extractfile(members[0]).read())
        return gpt2_tokenizer(path, save_dir)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("source", help="openai-whisper's .tar.gz, or a gpt2.tiktoken file")
    parser.add_argument("out", help="folder the tokenizer is saved to")
    args = parser.parse_args(argv)
    source = Path(args.source)
    tokenizer = (gpt2_tokenizer(source, args.out) if source.suffix == ".tiktoken"
                 else gpt2_tokenizer_from_sdist(source, args.out))
    print(f"GPT-2's tokenizer ({len(tokenizer)} ids) saved to {args.out}")


if __name__ == "__main__":
    main()
