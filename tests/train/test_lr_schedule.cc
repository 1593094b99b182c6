// test_lr_schedule.cc — every schedule type against values worked out by hand from Transformers'
// formulas (optimization.py), at the warmup boundary, mid-decay, the end, past the end and, for
// cosine_with_restarts, around a restart.
#include <gtest/gtest.h>

#include <cmath>

#include "onyx/error.h"
#include "train/lr_schedule.h"

using onyx::train::ScheduleConfig;

namespace {

struct Case {
  const char* type;
  int64_t warmup, total;
  double num_cycles;  // -1: default
  double power;
  int64_t step;
  double expected_lr;            // base_lr = 1e-3
  const char* kwargs = nullptr;  // lr_scheduler_kwargs (JSON)
};

// Hand computations (b = 1e-3):
//  linear   w=10 T=110: s<10 → b*s/10; s≥10 → b*(110-s)/100, floored at 0.
//  cosine   w=10 T=110: p=(s-10)/100; b*0.5*(1+cos(pi*0.5*2*p)).
//           p=0.25 → 0.5*(1+cos(pi/4)) = 0.5*(1+0.7071067811865476) = 0.8535533905932738.
//  restarts w=0 T=100 cycles=2 (and default 1): p=s/100; b*0.5*(1+cos(pi*((c*p) mod 1))), 0 at p≥1.
//           c=2,s=49: (0.98 mod 1) → 0.5*(1+cos(0.98 pi)) = 0.5*(1-0.9980267284282716)
//           = 0.0009866357858642; s=50: restart, (1.0 mod 1)=0 → 1.
//           c=3,w=0,T=10,s=4: 1.2 mod 1 = 0.2 → 0.5*(1+cos(0.2 pi)) = 0.5*(1+0.8090169943749475).
//  polynomial w=10 T=110 lr_end=1e-7: pct=1-(s-10)/100; b*((b-1e-7)*pct^power+1e-7)/b.
//           power 1, s=60: 0.0009999*0.5+1e-7 = 0.00050005; power 2, s=60: 0.0009999*0.25+1e-7
//           = 0.000250075; s=110 and s=200 → 1e-7.
//  constant: b at every step, warmup ignored.
//  constant_with_warmup w=4: b*s/4 below 4, then b.
//  inverse_sqrt w=4 (timescale 4): s<4 → b*s/4; else b/sqrt((s+0)/4): s=16 → b/2, s=36 → b/3.
//           w=0 (timescale 10000): b/sqrt((s+10000)/10000): s=0 → b, s=30000 → b/2.
const Case kCases[] = {
    {"linear", 10, 110, -1, 1, 0, 0.0},
    {"linear", 10, 110, -1, 1, 5, 5e-4},
    {"linear", 10, 110, -1, 1, 9, 9e-4},
    {"linear", 10, 110, -1, 1, 10, 1e-3},
    {"linear", 10, 110, -1, 1, 60, 5e-4},
    {"linear", 10, 110, -1, 1, 85, 2.5e-4},
    {"linear", 10, 110, -1, 1, 110, 0.0},
    {"linear", 10, 110, -1, 1, 150, 0.0},
    {"linear", 0, 100, -1, 1, 0, 1e-3},
    {"linear", 0, 100, -1, 1, 1, 0.99e-3},
    {"cosine", 10, 110, -1, 1, 5, 5e-4},
    {"cosine", 10, 110, -1, 1, 10, 1e-3},
    {"cosine", 10, 110, -1, 1, 35, 0.8535533905932738e-3},
    {"cosine", 10, 110, -1, 1, 60, 5e-4},
    {"cosine", 10, 110, -1, 1, 85, 0.1464466094067262e-3},
    {"cosine", 10, 110, -1, 1, 110, 0.0},
    {"cosine", 10, 110, 1.0, 1, 60, 0.0},    // a full cycle: back to 0 mid-way ...
    {"cosine", 10, 110, 1.0, 1, 110, 1e-3},  // ... and up to b at the end
    {"cosine_with_restarts", 0, 100, 2, 1, 0, 1e-3},
    {"cosine_with_restarts", 0, 100, 2, 1, 25, 5e-4},
    {"cosine_with_restarts", 0, 100, 2, 1, 49, 0.0009866357858642205e-3},
    {"cosine_with_restarts", 0, 100, 2, 1, 50, 1e-3},
    {"cosine_with_restarts", 0, 100, 2, 1, 75, 5e-4},
    {"cosine_with_restarts", 0, 100, 2, 1, 100, 0.0},
    {"cosine_with_restarts", 0, 10, 3, 1, 4, 0.9045084971874735e-3},
    {"cosine_with_restarts", 10, 110, -1, 1, 5, 5e-4},   // warmup
    {"cosine_with_restarts", 10, 110, -1, 1, 60, 5e-4},  // default 1 cycle = cosine
    {"cosine_with_restarts", 10, 110, -1, 1, 120, 0.0},
    {"polynomial", 10, 110, -1, 1, 5, 5e-4},
    {"polynomial", 10, 110, -1, 1, 10, 1e-3},
    {"polynomial", 10, 110, -1, 1, 60, 0.00050005},
    {"polynomial", 10, 110, -1, 2, 60, 0.000250075},
    {"polynomial", 10, 110, -1, 1, 110, 1e-7},
    {"polynomial", 10, 110, -1, 1, 200, 1e-7},
    {"constant", 10, 110, -1, 1, 0, 1e-3},
    {"constant", 10, 110, -1, 1, 500, 1e-3},
    {"constant_with_warmup", 4, 0, -1, 1, 0, 0.0},
    {"constant_with_warmup", 4, 0, -1, 1, 1, 2.5e-4},
    {"constant_with_warmup", 4, 0, -1, 1, 4, 1e-3},
    {"constant_with_warmup", 4, 0, -1, 1, 1000, 1e-3},
    {"inverse_sqrt", 4, 0, -1, 1, 2, 5e-4},
    {"inverse_sqrt", 4, 0, -1, 1, 4, 1e-3},
    {"inverse_sqrt", 4, 0, -1, 1, 16, 5e-4},
    {"inverse_sqrt", 4, 0, -1, 1, 36, 1e-3 / 3},
    {"inverse_sqrt", 0, 0, -1, 1, 0, 1e-3},
    {"inverse_sqrt", 0, 0, -1, 1, 30000, 5e-4},
    // cosine_with_min_lr w=10 T=110, min_lr_rate .25: p=.5 -> 0.5*.75+.25; the end -> .25
    {"cosine_with_min_lr", 10, 110, -1, 1, 5, 5e-4, R"({"min_lr_rate": 0.25})"},
    {"cosine_with_min_lr", 10, 110, -1, 1, 60, 6.25e-4, R"({"min_lr_rate": 0.25})"},
    {"cosine_with_min_lr", 10, 110, -1, 1, 110, 2.5e-4, R"({"min_lr": 2.5e-4})"},
    // cosine_warmup_with_min_lr: warmup (s+1)/w; progress (s-w+1)/(T-w): s=59 -> p=.5
    {"cosine_warmup_with_min_lr", 10, 110, -1, 1, 0, 1e-4, R"({"min_lr_rate": 0.25})"},
    {"cosine_warmup_with_min_lr", 10, 110, -1, 1, 59, 6.25e-4, R"({"min_lr_rate": 0.25})"},
    // warmup_stable_decay w=10 T=110 decay 20 (stable 80), linear warmup, cosine decay to 0
    {"warmup_stable_decay", 10, 110, -1, 1, 5, 5e-4, R"({"num_decay_steps": 20})"},
    {"warmup_stable_decay", 10, 110, -1, 1, 50, 1e-3, R"({"num_decay_steps": 20})"},
    {"warmup_stable_decay", 10, 110, -1, 1, 100, 5e-4, R"({"num_decay_steps": 20})"},
    {"warmup_stable_decay", 10, 110, -1, 1, 120, 0.0, R"({"num_decay_steps": 20})"},
    // reduce_lr_on_plateau: no warmup; the base lr until evaluations reduce it (PlateauSteps)
    {"reduce_lr_on_plateau", 10, 110, -1, 1, 5, 1e-3},
    // greedy: no warmup either; the base lr until evaluations change it (GreedySteps)
    {"greedy", 10, 110, -1, 1, 5, 1e-3},
};

TEST(LrSchedule, TableOfHandComputedValues) {
  for (const Case& c : kCases) {
    ScheduleConfig cfg;
    cfg.type = c.type;
    cfg.warmup_steps = c.warmup;
    cfg.total_steps = c.total;
    cfg.base_lr = 1e-3;
    cfg.num_cycles = c.num_cycles;
    cfg.power = c.power;
    if (c.kwargs) onyx::train::apply_scheduler_kwargs(cfg, c.kwargs);
    double lr = onyx::train::lr_at(cfg, c.step);
    EXPECT_NEAR(lr, c.expected_lr, 1e-15 + 1e-12 * std::abs(c.expected_lr))
        << c.type << " warmup=" << c.warmup << " total=" << c.total << " cycles=" << c.num_cycles
        << " power=" << c.power << " step=" << c.step;
  }
}

TEST(LrSchedule, EveryTypeIsCovered) {
  for (auto& name : onyx::train::schedule_names()) {
    bool found = false;
    for (const Case& c : kCases) found |= name == c.type;
    EXPECT_TRUE(found) << name;
  }
}

TEST(LrSchedule, WarmupRatioRoundsUpLikeTransformers) {
  ScheduleConfig cfg;
  cfg.total_steps = 95;
  cfg.warmup_ratio = 0.1;  // 9.5 → 10
  EXPECT_EQ(onyx::train::effective_warmup_steps(cfg), 10);
  cfg.total_steps = 1000;
  cfg.warmup_ratio = 0.03;  // 30 exactly
  EXPECT_EQ(onyx::train::effective_warmup_steps(cfg), 30);
  cfg.warmup_steps = 7;  // explicit steps win
  EXPECT_EQ(onyx::train::effective_warmup_steps(cfg), 7);
  // linear with warmup 10 of 95 steps: step 5 → b/2; step 10 → b; step 52.5 would be b/2.
  cfg = ScheduleConfig{};
  cfg.total_steps = 95;
  cfg.warmup_ratio = 0.1;
  cfg.base_lr = 2e-5;
  EXPECT_DOUBLE_EQ(onyx::train::lr_at(cfg, 5), 1e-5);
  EXPECT_DOUBLE_EQ(onyx::train::lr_at(cfg, 10), 2e-5);
  EXPECT_DOUBLE_EQ(onyx::train::lr_at(cfg, 95), 0.0);
}

TEST(LrSchedule, UnknownTypeListsValidNames) {
  ScheduleConfig cfg;
  cfg.type = "cosine_restarts";
  cfg.total_steps = 10;
  try {
    onyx::train::lr_at(cfg, 0);
    FAIL() << "expected onyx::Error";
  } catch (const onyx::Error& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find("cosine_restarts"), std::string::npos) << msg;
    for (auto& n : onyx::train::schedule_names()) EXPECT_NE(msg.find(n), std::string::npos) << msg;
  }
}

TEST(LrSchedule, InvalidConfigsThrow) {
  ScheduleConfig cfg;
  cfg.type = "linear";
  cfg.total_steps = 0;  // decaying schedules need a length
  EXPECT_THROW(onyx::train::lr_at(cfg, 0), onyx::Error);
  cfg.type = "polynomial";
  cfg.total_steps = 10;
  cfg.base_lr = 1e-8;  // below lr_end
  EXPECT_THROW(onyx::train::lr_at(cfg, 0), onyx::Error);
  cfg.base_lr = 1e-3;
  EXPECT_THROW(onyx::train::lr_at(cfg, -1), onyx::Error);
  cfg.warmup_ratio = 1.5;
  EXPECT_THROW(onyx::train::validate_schedule(cfg), onyx::Error);
}

}  // namespace

// torch's ReduceLROnPlateau.step on a metric sequence (min, rel 1e-4, patience 1, factor 0.5,
// cooldown 1): 1.0 best; 1.0 and 0.99995 are not better by the threshold -> 2 bad > 1: halve;
// then a cooldown evaluation that does not count; 0.5 better; two bad ones: halve again.
TEST(LrSchedule, PlateauSteps) {
  ScheduleConfig c;
  c.type = "reduce_lr_on_plateau";
  c.base_lr = 1e-3;
  onyx::train::apply_scheduler_kwargs(c, R"({"factor": 0.5, "patience": 1, "cooldown": 1})");
  onyx::train::MetricLrState s;
  const double metrics[] = {1.0, 1.0, 0.99995, 2.0, 0.5, 0.6, 0.7};
  const double lr_after[] = {1e-3, 1e-3, 5e-4, 5e-4, 5e-4, 5e-4, 2.5e-4};
  for (int i = 0; i < 7; i++) {
    onyx::train::plateau_step(c, s, metrics[i]);
    EXPECT_DOUBLE_EQ(onyx::train::lr_at(c, 0, &s), lr_after[i]) << "after evaluation " << i + 1;
  }
}

// Transformers' GreedyLR.step (patience 1, factor 0.5, min_lr 5e-4, abs threshold 0, reset_start
// 2): two better evaluations double the lr; two worse halve it, twice; at min_lr, a second
// reduction at the floor resets it to the base lr and forgets the best, so 300 is better again.
TEST(LrSchedule, GreedySteps) {
  ScheduleConfig c;
  c.type = "greedy";
  c.base_lr = 1e-3;
  onyx::train::apply_scheduler_kwargs(
      c, R"({"factor": 0.5, "patience": 1, "min_lr": 5e-4, "threshold": 0, "reset_start": 2})");
  onyx::train::MetricLrState s;
  const double metrics[] = {3, 2, 4, 5, 6, 7, 100, 200, 300};
  const double lr_after[] = {1e-3, 2e-3, 2e-3, 1e-3, 1e-3, 5e-4, 5e-4, 1e-3, 1e-3};
  for (int i = 0; i < 9; i++) {
    onyx::train::greedy_step(c, s, metrics[i]);
    EXPECT_DOUBLE_EQ(onyx::train::lr_at(c, 0, &s), lr_after[i]) << "after evaluation " << i + 1;
  }
  EXPECT_EQ(s.best, 300);
  EXPECT_EQ(s.num_good, 1);
  ScheduleConfig r = c;  // at the floor: the next two reductions reset
  onyx::train::apply_scheduler_kwargs(r, R"({"min_lr": 1e-3, "reset_start": 2})");
  onyx::train::MetricLrState t;
  t.lr = 1e-3;
  for (double m : {1.0, 2.0, 3.0}) onyx::train::greedy_step(r, t, m);
  EXPECT_EQ(t.reset_start, 1);
  for (double m : {4.0, 5.0}) onyx::train::greedy_step(r, t, m);
  EXPECT_EQ(t.reset_start, 2);  // reset: the initial state
  EXPECT_FALSE(t.has_best);
  EXPECT_DOUBLE_EQ(onyx::train::lr_at(r, 0, &t), 1e-3);
  const char* bad[][2] = {{R"({"factor": 1.0})", "Factor should be < 1.0."},
                          {R"({"mode": "up"})", "mode up is unknown!"},
                          {R"({"min_lr": [1e-3, 1e-4]})", "expected 1 min_lrs, got 2"},
                          {R"({"smooth": 1})", "'smooth' must be true or false"}};
  for (auto& [kw, msg] : bad) {
    ScheduleConfig b;
    b.type = "greedy";
    std::string e;
    try {
      onyx::train::apply_scheduler_kwargs(b, kw);
      onyx::train::validate_schedule(b);
    } catch (const onyx::Error& x) {
      e = x.what();
    }
    EXPECT_NE(e.find(msg), std::string::npos) << kw << ": " << e;
  }
}
