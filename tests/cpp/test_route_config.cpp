// The routing configuration grammar: valid files, and one case per mistake
// with the message it must give.

#include <gtest/gtest.h>

#include "routing/config.h"

using namespace torch_fl::routing;

namespace {

ParsedConfig parse(const std::string& text) { return parse_config(text, "t.conf"); }

std::string only_error(const std::string& text) {
  auto p = parse(text);
  EXPECT_EQ(p.errors.size(), 1u) << text;
  return p.errors.empty() ? "" : p.errors[0].to_string();
}

}  // namespace

TEST(RouteConfig, ParsesEntriesCommentsBlankLinesAndChains) {
  auto p = parse(
      "# header\n"
      "\n"
      "mm = cuda            # trailing comment\n"
      "  add.Tensor=flaggems , cpu\r\n"
      "aten::bmm.out = native\n"
      "torchvision::nms = cpu\n");
  ASSERT_TRUE(p.errors.empty()) << p.errors[0].to_string();
  ASSERT_EQ(p.entries.size(), 4u);
  EXPECT_EQ(p.entries[0].op, "mm");
  EXPECT_EQ(p.entries[0].line, 3);
  EXPECT_EQ(p.entries[0].chain, std::vector<Backend>{Backend::kCuda});
  EXPECT_EQ(p.entries[1].op, "add.Tensor");
  EXPECT_EQ(p.entries[1].chain, (std::vector<Backend>{Backend::kFlagGems, Backend::kCpu}));
  EXPECT_EQ(p.entries[2].op, "bmm.out") << "aten:: is dropped";
  EXPECT_EQ(p.entries[3].op, "torchvision::nms") << "other namespaces are kept";
}

TEST(RouteConfig, StarIsTheDefaultEntryAndStandsAlone) {
  auto p = parse("* = cuda, native\nmm = flaggems\n");
  ASSERT_TRUE(p.errors.empty()) << p.errors[0].to_string();
  ASSERT_EQ(p.entries.size(), 2u);
  EXPECT_EQ(p.entries[0].op, "*");
  EXPECT_EQ(p.entries[0].chain, (std::vector<Backend>{Backend::kCuda, Backend::kNative}));
  for (const char* bad : {"*.out = cuda", "aten::* = cuda", "** = cuda", "mm* = cuda"}) {
    EXPECT_NE(only_error(bad).find("malformed op name"), std::string::npos) << bad;
  }
  EXPECT_NE(only_error("* = cuda\n* = cpu\n").find("routed twice"), std::string::npos);
}

TEST(RouteConfig, SpecAliasesAllMeanFlagGems) {
  for (const char* alias : {"flagos", "flagos_python", "flaggems_python", "flaggems"}) {
    auto p = parse(std::string("mm = ") + alias);
    ASSERT_EQ(p.entries.size(), 1u) << alias;
    EXPECT_EQ(p.entries[0].chain[0], Backend::kFlagGems) << alias;
  }
}

TEST(RouteConfig, EmptyFileAndOnlyCommentsAreValid) {
  EXPECT_TRUE(parse("").entries.empty());
  EXPECT_TRUE(parse("").errors.empty());
  EXPECT_TRUE(parse("# a\n   # b\n\n").errors.empty());
}

TEST(RouteConfig, UnknownBackendNamesLineTokenChoicesAndGuess) {
  std::string msg = only_error("\nmm = cdua\n");
  EXPECT_NE(msg.find("t.conf:2:"), std::string::npos) << msg;
  EXPECT_NE(msg.find("'cdua'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("cuda, cpu, native"), std::string::npos) << msg;
  EXPECT_NE(msg.find("Did you mean 'cuda'?"), std::string::npos) << msg;
}

TEST(RouteConfig, MalformedLineWithoutEquals) {
  std::string msg = only_error("mm cuda\n");
  EXPECT_NE(msg.find("t.conf:1: malformed line 'mm cuda'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("expected 'op = backend'"), std::string::npos) << msg;
}

TEST(RouteConfig, TwoEqualsSignsAreMalformed) {
  EXPECT_NE(only_error("mm = cuda = cpu").find("more than one '='"), std::string::npos);
}

TEST(RouteConfig, BadOpNames) {
  for (const char* bad : {"= cuda", "m m = cuda", "mm. = cuda", ".out = cuda",
                          "a-b = cuda", "::mm = cuda", "mm.out.x = cuda"}) {
    std::string msg = only_error(bad);
    EXPECT_NE(msg.find("malformed op name"), std::string::npos) << bad << " -> " << msg;
  }
}

TEST(RouteConfig, EmptyAndDuplicateBackendsInChain) {
  EXPECT_NE(only_error("mm = ").find("empty backend"), std::string::npos);
  EXPECT_NE(only_error("mm = cuda,").find("empty backend"), std::string::npos);
  EXPECT_NE(only_error("mm = cuda, cuda").find("appears twice"), std::string::npos);
  // flagos and flaggems are the same backend.
  EXPECT_NE(only_error("mm = flagos, flaggems").find("appears twice"), std::string::npos);
}

TEST(RouteConfig, DuplicateOpPointsAtFirstLine) {
  std::string msg = only_error("mm = cuda\nmm = cpu\n");
  EXPECT_NE(msg.find("t.conf:2:"), std::string::npos) << msg;
  EXPECT_NE(msg.find("first at line 1"), std::string::npos) << msg;
}

TEST(RouteConfig, AllMistakesOfAFileAreReportedAndValidLinesKept) {
  auto p = parse("mm = cuda\nbad\nadd = nope\ncat = cpu\nx y = cpu\n");
  EXPECT_EQ(p.errors.size(), 3u);
  ASSERT_EQ(p.entries.size(), 2u);
  EXPECT_EQ(p.entries[1].op, "cat");
  EXPECT_EQ(p.errors[0].line, 2);
  EXPECT_EQ(p.errors[1].line, 3);
  EXPECT_EQ(p.errors[2].line, 5);
}

TEST(RouteConfig, ControlBytesAreEscapedInMessages) {
  std::string msg = only_error(std::string("mm = cu\x01" "da"));
  EXPECT_NE(msg.find("\\x01"), std::string::npos) << msg;
}

TEST(ClosestMatch, SuggestsOnlyPlausibleSpellings) {
  std::vector<std::string> names = {"softmax", "log_softmax", "mm", "bmm"};
  EXPECT_EQ(closest_match("sofmax", names), "softmax");
  EXPECT_EQ(closest_match("smoftax", names), "softmax");
  EXPECT_EQ(closest_match("completely_different", names), "");
}
