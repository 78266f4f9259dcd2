"""A WordPiece tokenizer trained on the tool corpus and training queries (HF ``tokenizers``).

Offline there is no pretrained vocabulary to download, and a vocabulary learned from the corpus
covers its API names and parameter words far better than a generic one of the same size.
"""

from __future__ import annotations

from collections.abc import Iterable

from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
from transformers import PreTrainedTokenizerFast

SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]


def train_wordpiece(
    texts: Iterable[str], vocab_size: int = 8000, min_frequency: int = 2
) -> PreTrainedTokenizerFast:
    """Train a BERT-style uncased WordPiece tokenizer.

    Returns:
        A ``PreTrainedTokenizerFast`` that ``save_pretrained`` writes in the standard HF layout, so
        ``AutoTokenizer.from_pretrained(dir)`` reloads it like any hub tokenizer.
    """
    tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True, strip_accents=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    trainer = trainers.WordPieceTrainer(
        vocab_size=vocab_size, min_frequency=min_frequency, special_tokens=SPECIALS
    )
    tok.train_from_iterator(texts, trainer=trainer)
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
