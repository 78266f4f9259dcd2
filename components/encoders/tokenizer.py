"""A WordPiece tokenizer trained on the tool corpus and training queries (HF ``tokenizers``).

Offline there is no pretrained vocabulary to download, and a vocabulary learned from the corpus
covers its API names and parameter words far better than a generic one of the same size.
"""

from __future__ import annotations

from collections.abc import Iterable

from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors
from transformers import PreTrainedTokenizerFast

from components.data.subword import learn_bpe

SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]


def train_wordpiece(
    texts: Iterable[str], vocab_size: int = 8000, min_frequency: int = 2
) -> PreTrainedTokenizerFast:
    """Train a BERT-style uncased WordPiece tokenizer; equal ``texts`` give an identical vocabulary.

    Returns:
        A ``PreTrainedTokenizerFast`` that ``save_pretrained`` writes in the standard HF layout, so
        ``AutoTokenizer.from_pretrained(dir)`` reloads it like any hub tokenizer.
    """
    normalizer = normalizers.BertNormalizer(lowercase=True, strip_accents=True)
    pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    words = (
        word for text in texts for word, _ in pre_tokenizer.pre_tokenize_str(normalizer.normalize_str(text))
    )
    # The same BPE-then-WordPiece recipe as ``tokenizers.trainers.WordPieceTrainer``, with ties
    # broken deterministically (see :mod:`.subword`).
    learned = learn_bpe(words, vocab_size, min_frequency, specials=SPECIALS, prefix="##")
    tok = Tokenizer(models.WordPiece(learned.vocab, unk_token="[UNK]", continuing_subword_prefix="##"))
    tok.normalizer = normalizer
    tok.pre_tokenizer = pre_tokenizer
    cls, sep = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]",
        pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", cls), ("[SEP]", sep)],
    )
    tok.decoder = decoders.WordPiece()
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        unk_token="[UNK]",
        pad_token="[PAD]",
        cls_token="[CLS]",
        sep_token="[SEP]",
        mask_token="[MASK]",
        model_max_length=512,
    )
