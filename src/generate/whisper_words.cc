// whisper_words.cc — see whisper_words.h. The "in" tests below are Python's substring tests, as
// the pipeline writes them (a stripped word "" is "in" any string).
#include "generate/whisper_words.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <set>

namespace onyx::generate {
namespace {

constexpr double kTimePrecision = 0.02;
constexpr int64_t kSegmentSize = 1500;  // _decode_asr's segment_size (encoder positions)
const char* const kPunctuation = "!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~";
const char* const kPrepended = "\"'\u201c\u00a1\u00bf([{-";
const char* const kAppended = "\"'.\u3002,\uff0c!\uff01?\uff1f:\uff1a\u201d)]}\u3001";

// Python's round(x, 2): the decimal nearest to the double's exact value.
double round2(double x) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.2f", x);
  return std::strtod(buf, nullptr);
}

bool contains(const std::string& haystack, const std::string& needle) {
  return haystack.find(needle) != std::string::npos;
}

// Python's str.strip(): white space (str.isspace) off both ends.
std::string py_strip(const std::string& s) {
  static const std::set<char32_t> space = {
      U'\t',     U'\n',     U'\v',     U'\f',     U'\r',     U' ',      U'\x1c',   U'\x1d',
      U'\x1e',   U'\x1f',   U'\x85',   U'\xa0',   U'\u1680', U'\u2000', U'\u2001', U'\u2002',
      U'\u2003', U'\u2004', U'\u2005', U'\u2006', U'\u2007', U'\u2008', U'\u2009', U'\u200a',
      U'\u2028', U'\u2029', U'\u202f', U'\u205f', U'\u3000'};
  std::u32string u = tokenizers::unicode::decode_utf8(s);
  size_t a = 0, b = u.size();
  while (a < b && space.count(u[a])) a++;
  while (b > a && space.count(u[b - 1])) b--;
  return tokenizers::unicode::encode_utf8(u.substr(a, b - a));
}

struct Word {
  std::string text;
  std::vector<int64_t> ids;
  std::vector<size_t> at;  // the tokens' indices in the chunk
};

// _split_tokens_on_unicode: a word ends where the tokens so far decode to whole characters (a
// U+FFFD that the whole text also has at that place counts as one).
std::vector<Word> split_on_unicode(const std::vector<int64_t>& ids,
                                   const tokenizers::Tokenizer& tok) {
  const std::u32string full = tokenizers::unicode::decode_utf8(tok.decode(ids));
  std::vector<Word> out;
  Word cur;
  size_t offset = 0;
  for (size_t i = 0; i < ids.size(); i++) {
    cur.ids.push_back(ids[i]);
    cur.at.push_back(i);
    const std::string text = tok.decode(cur.ids);
    const std::u32string d = tokenizers::unicode::decode_utf8(text);
    const size_t bad = d.find(U'\uFFFD');
    if (bad == std::u32string::npos || offset + bad >= full.size() ||
        full[offset + bad] == U'\uFFFD') {
      cur.text = text;
      offset += d.size();
      out.push_back(std::move(cur));
      cur = Word{};
    }
  }
  return out;
}

// _split_tokens_on_spaces: the unicode words joined unless one starts with a space, is
// punctuation or a special token.
std::vector<Word> split_on_spaces(const std::vector<int64_t>& ids,
                                  const tokenizers::Tokenizer& tok) {
  const int64_t eos = tok.eos_id().value_or(INT64_MAX);
  std::vector<Word> words;
  for (Word& w : split_on_unicode(ids, tok)) {
    const bool special = w.ids[0] >= eos;
    const bool with_space = !w.text.empty() && w.text[0] == ' ';
    const bool punctuation = contains(kPunctuation, py_strip(w.text));
    if (special || with_space || punctuation || words.empty()) {
      words.push_back(std::move(w));
    } else {
      Word& last = words.back();
      last.text += w.text;
      last.ids.insert(last.ids.end(), w.ids.begin(), w.ids.end());
      last.at.insert(last.at.end(), w.at.begin(), w.at.end());
    }
  }
  return words;
}

// `from` appended to `to` (prepend: put before it), `from` emptied.
void move_into(Word& from, Word& to, bool prepend) {
  if (prepend) {
    to.text = from.text + to.text;
    to.ids.insert(to.ids.begin(), from.ids.begin(), from.ids.end());
    to.at.insert(to.at.begin(), from.at.begin(), from.at.end());
  } else {
    to.text += from.text;
    to.ids.insert(to.ids.end(), from.ids.begin(), from.ids.end());
    to.at.insert(to.at.end(), from.at.begin(), from.at.end());
  }
  from = Word{};
}

// _merge_punctuations: opening marks into the next word, closing marks into the previous one.
void merge_punctuations(std::vector<Word>& w) {
  for (int64_t i = (int64_t)w.size() - 2, j = (int64_t)w.size() - 1; i >= 0; i--) {
    if (!w[i].text.empty() && w[i].text[0] == ' ' && contains(kPrepended, py_strip(w[i].text)))
      move_into(w[i], w[j], true);
    else
      j = i;
  }
  for (size_t i = 0, j = 1; j < w.size(); j++) {
    if ((w[i].text.empty() || w[i].text.back() != ' ') && contains(kAppended, w[j].text))
      move_into(w[j], w[i], false);
    else
      i = j;
  }
  w.erase(std::remove_if(w.begin(), w.end(), [](const Word& x) { return x.text.empty(); }),
          w.end());
}

// One chunk's text tokens with their (start, end) times as words (_collate_word_timestamps).
void collate(const std::vector<int64_t>& ids, const std::vector<std::pair<double, double>>& times,
             const tokenizers::Tokenizer& tok, bool unicode, std::vector<WhisperWord>& out) {
  std::vector<Word> words = unicode ? split_on_unicode(ids, tok) : split_on_spaces(ids, tok);
  merge_punctuations(words);
  for (const Word& w : words)
    out.push_back({w.text, times[w.at.front()].first, times[w.at.back()].second});
}

}  // namespace

bool whisper_language_without_spaces(const std::string& language) {
  std::string l = language;
  if (l.size() > 4 && l.rfind("<|", 0) == 0 && l.substr(l.size() - 2) == "|>")
    l = l.substr(2, l.size() - 4);
  std::transform(l.begin(), l.end(), l.begin(), [](unsigned char c) { return std::tolower(c); });
  static const std::set<std::string> kNoSpaces = {"chinese", "japanese",  "thai", "lao",
                                                  "myanmar", "cantonese", "zh",   "ja",
                                                  "th",      "lo",        "my",   "yue"};
  return kNoSpaces.count(l) > 0;
}

std::vector<WhisperWord> whisper_words(const std::vector<int64_t>& tokens,
                                       const std::vector<double>& token_times,
                                       int64_t timestamp_begin, const tokenizers::Tokenizer& tok,
                                       const std::string& language) {
  const bool unicode = whisper_language_without_spaces(language);
  const int64_t tb = timestamp_begin;
  std::vector<WhisperWord> out;
  std::optional<double> chunk_start;
  std::vector<int64_t> ids;
  std::vector<std::pair<double, double>> times;
  // the pipeline's running time of a timestamp token across windows (their times restart)
  double cur_max = 0, penultimate = 0, previous_windows = 0;
  for (size_t i = 0; i < tokens.size(); i++) {
    const int64_t t = tokens[i];
    const tokenizers::AddedToken* added = tok.added_token(t);
    if (added && added->special) continue;
    if (tb < 0 || t < tb) {  // text
      ids.push_back(t);
      times.emplace_back(i == 0 ? 0.0 : round2(token_times[i - 1]), round2(token_times[i]));
      continue;
    }
    const double stamp = (double)(t - tb) * kTimePrecision;
    if (stamp < cur_max) {
      const bool single_ending = i >= 2 && !(tokens[i - 1] >= tb && tokens[i - 2] >= tb);
      if (single_ending) {
        previous_windows += kTimePrecision * kSegmentSize;
      } else {
        cur_max = penultimate;
        previous_windows += penultimate;
      }
    }
    penultimate = cur_max;
    cur_max = stamp;
    const double time = round2(stamp + previous_windows);
    if (!chunk_start) {
      chunk_start = time;
    } else if (time != *chunk_start) {  // the chunk ends
      collate(ids, times, tok, unicode, out);
      ids.clear();
      times.clear();
      chunk_start.reset();
    }
  }
  if (!ids.empty()) collate(ids, times, tok, unicode, out);
  return out;
}

}  // namespace onyx::generate
