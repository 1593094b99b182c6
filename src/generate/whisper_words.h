// generate/whisper_words.h — Whisper's word-level timestamps from its token timestamps, as
// Transformers' speech-recognition pipeline makes them (return_timestamps="word":
// WhisperTokenizer._decode_asr with _collate_word_timestamps): the text tokens between timestamp
// tokens are a chunk (a timestamp at a new time closes the chunk), each chunk's tokens are split
// into words — at a token that decodes to a leading space or punctuation, or, for languages
// written without spaces, wherever the text so far decodes to whole characters —, punctuation is
// merged into its neighbour (opening marks into the next word, closing marks into the previous),
// and a word spans from the time of the token before its first to the time of its last token
// (each rounded to 0.01 s).
//
// Where the pipeline reads the language from the decoded tokens — which Transformers 5's
// generate() strips, so it always splits at spaces unless the tokenizer was given a language —
// onyx takes the transcription's language (given or detected): Chinese, Japanese, Thai, Lao,
// Myanmar and Cantonese split at characters, as OpenAI's whisper does.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "tokenizers/tokenizer.h"

namespace onyx::generate {

struct WhisperWord {
  std::string text;  // with its leading space, as the pipeline's chunks
  double start = 0, end = 0;
};

// The words of one transcription: `tokens` (timestamps and special tokens included, as
// WhisperTranscript::tokens) with `token_times` (one per token, seconds), `timestamp_begin` the
// first timestamp token; `language` a Whisper language name or code ("" : english).
std::vector<WhisperWord> whisper_words(const std::vector<int64_t>& tokens,
                                       const std::vector<double>& token_times,
                                       int64_t timestamp_begin, const tokenizers::Tokenizer& tok,
                                       const std::string& language);

// Whether Whisper's word timestamps split `language` (a name or code) at characters.
bool whisper_language_without_spaces(const std::string& language);

}  // namespace onyx::generate
