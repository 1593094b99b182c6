// whisper_token_times.cc — see whisper_token_times.h. Float32 where Transformers computes in
// float32 (the normalized weights, the path costs), so the path's comparisons see the same values.
#include "generate/whisper_token_times.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "onyx/error.h"

namespace onyx::generate {
namespace {

constexpr double kTimePrecision = 0.02;  // seconds per encoder position

// Each (head, position) column of w (heads, n, m) to mean 0 and standard deviation 1 over the n
// tokens (torch.std(unbiased=False); a constant column becomes NaN, as there).
void normalize_over_tokens(std::vector<float>& w, int64_t heads, int64_t n, int64_t m) {
  for (int64_t h = 0; h < heads; h++)
    for (int64_t f = 0; f < m; f++) {
      float* col = w.data() + h * n * m + f;
      double sum = 0;
      for (int64_t i = 0; i < n; i++) sum += col[i * m];
      const double mean = sum / (double)n;
      double sq = 0;
      for (int64_t i = 0; i < n; i++) sq += (col[i * m] - mean) * (col[i * m] - mean);
      const float mean_f = (float)mean, std_f = (float)std::sqrt(sq / (double)n);
      for (int64_t i = 0; i < n; i++) col[i * m] = (col[i * m] - mean_f) / std_f;
    }
}

// Transformers' _median_filter along each row (m values) of `rows` rows: reflect-padded by
// width / 2, each value the median of the `width` around it (NaN sorted last, as torch.sort);
// rows no longer than width / 2 stay as they are.
void median_filter(std::vector<float>& x, int64_t rows, int64_t m, int64_t width) {
  const int64_t half = width / 2;
  if (m <= half) return;
  auto reflect = [&](int64_t f) { return f < 0 ? -f : f >= m ? 2 * (m - 1) - f : f; };
  auto nan_last = [](float a, float b) { return std::isnan(b) ? !std::isnan(a) : a < b; };
  std::vector<float> row((size_t)m), window((size_t)width);
  for (int64_t r = 0; r < rows; r++) {
    float* v = x.data() + r * m;
    std::copy(v, v + m, row.begin());
    for (int64_t f = 0; f < m; f++) {
      for (int64_t k = 0; k < width; k++) window[k] = row[reflect(f - half + k)];
      std::nth_element(window.begin(), window.begin() + half, window.end(), nan_last);
      v[f] = window[half];
    }
  }
}

// Python's len(range(length)[:stop]): a negative stop leaves -stop out.
int64_t slice_length(int64_t stop, int64_t length) {
  return stop >= 0 ? std::min(stop, length) : std::max<int64_t>(0, length + stop);
}

// The positions of row r's probabilities kept, of S: the first num_frames[r] // 2 (Python's
// rounding down). When every row has the same count Transformers crops twice (once for the
// batch, once per row), which leaves fewer for a negative count (a window after the audio's
// end): matched, so the times are the pipeline's.
int64_t cropped_positions(const std::vector<int64_t>& num_frames, size_t r, int64_t S) {
  const int64_t f = num_frames[r];
  const int64_t stop = f >= 0 ? f / 2 : -((1 - f) / 2);
  const int64_t once = slice_length(stop, S);
  const bool same =
      std::all_of(num_frames.begin(), num_frames.end(), [&](int64_t x) { return x == f; });
  return same ? slice_length(stop, once) : once;
}

}  // namespace

std::pair<std::vector<int64_t>, std::vector<int64_t>> dynamic_time_warping(
    const std::vector<double>& cost, int64_t n, int64_t m) {
  const int64_t W = m + 1;
  std::vector<float> acc((size_t)((n + 1) * W), std::numeric_limits<float>::infinity());
  std::vector<signed char> trace((size_t)((n + 1) * W), -1);
  acc[0] = 0;
  for (int64_t j = 1; j <= m; j++)
    for (int64_t i = 1; i <= n; i++) {
      const float c0 = acc[(i - 1) * W + j - 1], c1 = acc[(i - 1) * W + j], c2 = acc[i * W + j - 1];
      float c = c2;
      signed char t = 2;
      if (c0 < c1 && c0 < c2) {
        c = c0, t = 0;
      } else if (c1 < c0 && c1 < c2) {
        c = c1, t = 1;
      }
      acc[i * W + j] = (float)(cost[(i - 1) * m + j - 1] + (double)c);
      trace[i * W + j] = t;
    }
  for (int64_t j = 0; j <= m; j++) trace[j] = 2;
  for (int64_t i = 0; i <= n; i++) trace[i * W] = 1;
  std::vector<int64_t> text, time;
  for (int64_t i = n, j = m; i > 0 || j > 0;) {
    text.push_back(i - 1);
    time.push_back(j - 1);
    const signed char t = trace[i * W + j];
    if (t == 0) {
      i--, j--;
    } else if (t == 1) {
      i--;
    } else {
      j--;
    }
  }
  std::reverse(text.begin(), text.end());
  std::reverse(time.begin(), time.end());
  return {text, time};
}

std::vector<double> alignment_times(const std::vector<float>& w, int64_t heads, int64_t n,
                                    int64_t S, int64_t frames, int64_t median_filter_width) {
  ONYX_CHECK(median_filter_width >= 1 && median_filter_width % 2 == 1,
             "token timestamps: median_filter_width must be an odd number, got ",
             median_filter_width);
  ONYX_CHECK(frames >= 0 && frames <= S, "token timestamps: ", frames, " of ", S, " positions");
  if (n == 0) return {};
  const int64_t m = frames;
  std::vector<float> x((size_t)(heads * n * m));
  for (int64_t h = 0; h < heads; h++)
    for (int64_t i = 0; i < n; i++)
      std::copy_n(w.data() + (h * n + i) * S, m, x.data() + (h * n + i) * m);
  normalize_over_tokens(x, heads, n, m);
  median_filter(x, heads * n, m, median_filter_width);
  std::vector<double> cost((size_t)(n * m));  // -(the heads' mean)
  for (int64_t k = 0; k < n * m; k++) {
    double sum = 0;
    for (int64_t h = 0; h < heads; h++) sum += x[h * n * m + k];
    cost[k] = -(double)(float)(sum / (double)heads);
  }
  auto [text, time] = dynamic_time_warping(cost, n, m);
  std::vector<double> out;
  for (size_t k = 0; k < text.size(); k++)  // where the path first reaches each token
    if (k == 0 || text[k] != text[k - 1])
      out.push_back((double)(float)((double)time[k] * kTimePrecision));
  out.resize((size_t)n, out.empty() ? 0.0 : out.back());
  return out;
}

std::vector<std::vector<double>> whisper_token_times(
    Generator& gen, const std::vector<std::vector<int64_t>>& prompts,
    const std::vector<std::vector<int64_t>>& tokens, const Tensor& features,
    const std::vector<int64_t>& num_frames, int64_t pad, const WhisperTokenTiming& timing) {
  const int64_t B = (int64_t)tokens.size();
  ONYX_CHECK((int64_t)num_frames.size() == B, "token timestamps: ", B, " rows and ",
             num_frames.size(), " frame counts");
  int64_t N = 0, L = 0;
  for (const auto& t : tokens) N = std::max(N, (int64_t)t.size());
  for (const auto& p : prompts) L = std::max(L, (int64_t)p.size());
  std::vector<std::vector<double>> out((size_t)B);
  if (N < 2) {  // no step after the first token: every time 0
    for (int64_t r = 0; r < B; r++) out[r].assign(tokens[r].size(), 0.0);
    return out;
  }
  const Tensor w = gen.cross_attentions(prompts, tokens, pad, timing.alignment_heads,
                                        {{"input_features", features}});
  const int64_t H = w.dim(1), T = w.dim(2), S = w.dim(3), n = N - 1;
  for (int64_t r = 0; r < B; r++) {
    std::vector<float> rows((size_t)(H * n * S));  // the generated tokens' rows (not the prompt's)
    for (int64_t h = 0; h < H; h++)
      std::copy_n(w.data<float>() + ((r * H + h) * T + L) * S, n * S, rows.data() + h * n * S);
    const std::vector<double> t = alignment_times(
        rows, H, n, S, cropped_positions(num_frames, r, S), timing.median_filter_width);
    for (size_t j = 0; j < tokens[r].size(); j++) out[r].push_back(t[std::min(j, t.size() - 1)]);
  }
  return out;
}

}  // namespace onyx::generate
