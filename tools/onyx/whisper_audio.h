// whisper_audio.h — `onyx generate WHISPER --audio ...`'s audio: WAV files as Whisper's input
// features (resampled to 16 kHz; data/whisper_features.h), and their transcription with
// timestamps or of files longer than 30 s (generate/whisper_transcribe.h) as Transformers'
// speech-recognition pipeline runs it: a file up to 30 s is cut / padded to the window and
// batched with its neighbours; a longer one is decoded alone, window after window, with
// timestamps (Transformers turns them on for long-form audio).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "generate/whisper_prompt.h"
#include "generate/whisper_transcribe.h"
#include "onyx/tensor.h"

namespace onyx::cli {

// One file's features for model `c`: (mel, frames) — the window (2 * max_source_positions
// frames: 30 s) for a file up to 30 s; all of a longer file's frames (its samples / 160).
struct WhisperAudio {
  Tensor features;
  int64_t frames = 0, window = 0;
  // frames of sound (the feature extractor's attention mask: samples / 160 rounded up), for
  // token timestamps; -1: every frame (features given as they are)
  int64_t sound_frames = -1;
  bool long_form() const { return frames > window; }
};
WhisperAudio read_whisper_audio(const std::string& file, const models::HfConfig& c);

// Files of one window each, stacked: (N, mel, window).
Tensor stack_whisper_windows(const std::vector<WhisperAudio>& audio);

struct TranscribeOptions {
  std::string language, task;  // "": the config's, else detected (per file)
  bool timestamps = false;     // --return_timestamps (long-form files always have them)
  int64_t batch_size = 8;
  std::vector<int64_t> previous;  // a previous-text prompt before every window's (prompt_ids)
  bool condition_on_prev_tokens = false;      // each window after the text decoded so far
  generate::WhisperFallback fallback;         // temperatures and thresholds (none: one pass)
  generate::WhisperTokenTiming token_timing;  // token timestamps (none: off)
};
struct FileTranscript {
  std::vector<int64_t> prompt;  // the decoder prompt (the same for every window)
  generate::WhisperTranscript transcript;
};

// The files transcribed in order: runs of files up to 30 s in batches of batch_size, each
// longer file alone; the language detected on each file's first window.
std::vector<FileTranscript> transcribe_files(generate::Generator& gen,
                                             const generate::GenerationConfig& cfg,
                                             const generate::WhisperPromptConfig& whisper,
                                             int64_t start, const std::vector<WhisperAudio>& audio,
                                             const TranscribeOptions& o,
                                             generate::GenerationStats* stats);

}  // namespace onyx::cli
