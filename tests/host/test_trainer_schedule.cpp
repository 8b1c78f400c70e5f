// Tests of ncclkit/trainer/schedule.hpp against values computed by hand.
// ncclkit-test: labels=unit
#include <doctest/doctest.h>

#include <cmath>  // std::cos

#include "ncclkit/trainer/schedule.hpp"

using ncclkit::trainer::Decay;
using ncclkit::trainer::LrSchedule;

TEST_CASE("constant, with and without a linear warm-up") {
  const LrSchedule constant{.lr = 0.5};
  CHECK(constant.at(0) == 0.5);
  CHECK(constant.at(1000) == 0.5);
  const LrSchedule warm{.lr = 0.4, .warmup_steps = 4};
  CHECK(warm.at(0) == doctest::Approx(0.1));
  CHECK(warm.at(1) == doctest::Approx(0.2));
  CHECK(warm.at(3) == doctest::Approx(0.4));
  CHECK(warm.at(4) == 0.4);
}

TEST_CASE("cosine after the warm-up: lr at its start, the midpoint halfway, min_lr at total_steps and after") {
  const LrSchedule s{.lr = 1.0, .decay = Decay::kCosine, .warmup_steps = 10, .total_steps = 110, .min_lr = 0.1};
  CHECK(s.at(9) == doctest::Approx(1.0));
  CHECK(s.at(10) == doctest::Approx(1.0));
  CHECK(s.at(60) == doctest::Approx(0.55));  // 0.1 + 0.9 * (1 + cos(pi/2)) / 2
  CHECK(s.at(35) == doctest::Approx(0.1 + 0.9 * 0.5 * (1 + std::cos(3.14159265358979 * 0.25))));
  CHECK(s.at(110) == 0.1);
  CHECK(s.at(5000) == 0.1);
}

TEST_CASE("step decay: gamma per step_size steps after the warm-up") {
  const LrSchedule s{.lr = 0.8, .decay = Decay::kStep, .warmup_steps = 2, .step_size = 3, .gamma = 0.5};
  CHECK(s.at(2) == doctest::Approx(0.8));
  CHECK(s.at(4) == doctest::Approx(0.8));
  CHECK(s.at(5) == doctest::Approx(0.4));
  CHECK(s.at(11) == doctest::Approx(0.1));
}

TEST_CASE("bad schedules name the field") {
  CHECK(LrSchedule{.lr = 0}.problem().find("lr must be a positive number") != std::string::npos);
  CHECK(LrSchedule{.lr = 1, .decay = Decay::kCosine, .warmup_steps = 5, .total_steps = 5}.problem().find(
            "total_steps (5) above warmup_steps (5)") != std::string::npos);
  CHECK(LrSchedule{.lr = 1, .decay = Decay::kStep}.problem().find("step_size above 0") != std::string::npos);
  CHECK(LrSchedule{.lr = 1, .decay = Decay::kStep, .step_size = 2, .gamma = 2}.problem().find("gamma") !=
        std::string::npos);
  CHECK(LrSchedule{.lr = 0.3}.problem().empty());
}
