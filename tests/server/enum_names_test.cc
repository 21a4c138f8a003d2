// common/enum_names.h: the lowercase names of the engine options' proto enums, which every
// C++ parser of those options (recal-run's flags, recalctl, job admission, the engine) uses.
#include "common/enum_names.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "recal/v1/report.pb.h"

namespace recal {
namespace {

using ::testing::ElementsAre;

template <typename E>
void ExpectEveryNameRoundTrips() {
  for (const std::string& name : EnumNames<E>()) {
    const std::optional<E> value = EnumFromName<E>(name);
    ASSERT_TRUE(value.has_value()) << name;
    EXPECT_EQ(EnumName(*value), name);
  }
}

TEST(EnumNames, AreTheProtoValueNamesInLowercaseWithoutUnspecified) {
  EXPECT_THAT(EnumNames<v1::Estimator>(), ElementsAre("population", "batch_average"));
  EXPECT_THAT(EnumNames<v1::ModuleMode>(), ElementsAre("eval", "train", "as_saved"));
  EXPECT_THAT(EnumNames<v1::ComputeDtype>(), ElementsAre("float32", "bfloat16", "float16"));
  EXPECT_THAT(EnumNames<v1::MemoryFormat>(), ElementsAre("auto", "contiguous", "channels_last"));
}

TEST(EnumNames, EveryValueRoundTripsThroughItsName) {
  ExpectEveryNameRoundTrips<v1::Estimator>();
  ExpectEveryNameRoundTrips<v1::ModuleMode>();
  ExpectEveryNameRoundTrips<v1::ComputeDtype>();
  ExpectEveryNameRoundTrips<v1::MemoryFormat>();
  EXPECT_EQ(EnumFromName<v1::MemoryFormat>("channels_last"), v1::CHANNELS_LAST);
  EXPECT_EQ(EnumName(v1::BFLOAT16), "bfloat16");
}

TEST(EnumNames, RefusesUppercaseUnspecifiedAndUnknownNames) {
  EXPECT_FALSE(EnumFromName<v1::ComputeDtype>("FLOAT32").has_value());
  EXPECT_FALSE(EnumFromName<v1::ComputeDtype>("compute_dtype_unspecified").has_value());
  EXPECT_FALSE(EnumFromName<v1::ComputeDtype>("float64").has_value());
  EXPECT_FALSE(EnumFromName<v1::Estimator>("").has_value());
}

TEST(EnumNames, ListForMessagesNamesEveryValueWithOrBeforeTheLast) {
  EXPECT_EQ(EnumNameList<v1::Estimator>(), "population or batch_average");
  EXPECT_EQ(EnumNameList<v1::ModuleMode>(), "eval, train or as_saved");
  EXPECT_EQ(EnumNameList<v1::ComputeDtype>(), "float32, bfloat16 or float16");
  EXPECT_EQ(EnumNameList<v1::MemoryFormat>(), "auto, contiguous or channels_last");
}

}  // namespace
}  // namespace recal
