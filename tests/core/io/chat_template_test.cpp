// Chat templates rendered as transformers renders them (tests/python/chat_template_reference.py compiles
// each template in apply_chat_template's own Jinja environment): Llama-3-, ChatML/Qwen- and Mistral-style
// templates and one leaning on trim_blocks/lstrip_blocks alone, each on a lone question, a system message
// with several turns (non-ASCII, emoji) and reasoning turns, with and without the generation prompt, tools
// as indented JSON; a template of the rest of the subset; character for character. A template's
// raise_exception is an error with its message; what lies outside the subset is refused naming the line.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>

#include "core/io/chat_template.h"
#include "core/io/instruction_data.h"
#include "core/util/atomic_file.h"
#include "tests/support/python_reference.h"
#include "tests/support/test_util.h"

namespace kuafu::io {
namespace {
namespace fs = std::filesystem;

TEST(ChatTemplateTest, RendersWhatTransformersRendersCharacterForCharacter) {
  const fs::path dir = testing::temp_dir("chat_template_reference");
  const testing::PythonRun run = testing::run_python_reference("chat_template_reference.py", "build " + dir.string());
  ASSERT_EQ(run.exit_code, 0) << run.output;
  const auto templates = nlohmann::ordered_json::parse(read_file((dir / "templates.json").string()));
  const auto cases = nlohmann::ordered_json::parse(read_file((dir / "cases.json").string()));
  ASSERT_EQ(cases.size(), 32u);
  std::map<std::string, ChatTemplate> parsed;
  for (auto it = templates.begin(); it != templates.end(); ++it) {
    parsed.emplace(it.key(), ChatTemplate::parse(it.value().get<std::string>(), it.key()));
  }
  int errors = 0;
  for (const auto& c : cases) {
    const std::string name = c["template"];
    SCOPED_TRACE(name + ": " + c["context"].dump().substr(0, 120));
    const ChatTemplate& t = parsed.at(name);
    if (c.contains("error")) {
      ++errors;
      EXPECT_TRUE(testing::Contains(testing::expected_error([&] { t.render(c["context"]); }), c["error"].get<std::string>()));
      continue;
    }
    EXPECT_EQ(t.render(c["context"]), c["text"].get<std::string>());
  }
  EXPECT_EQ(errors, 1) << "the Mistral-style template refuses two user turns in a row";
}

// Examples framed by a tokenizer folder's template (tokenizer_config.json's chat_template, Llama-3 style,
// trained here on the Bible's lines): the ids transformers' apply_chat_template gives each conversation,
// the tokens learned exactly those it marks as the assistant's ({% generation %}: each answer and its
// <|eot_id|>), <|eot_id|> as the end of turn generation stops at, and a question's prompt as
// apply_chat_template(add_generation_prompt=True) gives it.
TEST(ChatTemplateTest, FramedExamplesAreTransformersIdsLearningTheAssistantTurns) {
  const fs::path dir = testing::temp_dir("chat_template_framed");
  const std::string exported = std::string(KUAFU_SOURCE_DIR) + "/data/kjv/export.sh " + (dir / "kjv").string() + " > /dev/null";
  ASSERT_EQ(std::system(exported.c_str()), 0) << "data/kjv/export.sh needs Debian's bible-kjv (scripts/setup)";
  const testing::PythonRun run = testing::run_python_reference(
      "chat_template_reference.py", "framed " + (dir / "kjv/kjv.txt").string() + " " + dir.string());
  ASSERT_EQ(run.exit_code, 0) << run.output;
  const auto expected = nlohmann::json::parse(read_file((dir / "expected.json").string()));
  const BpeTokenizer tokenizer = BpeTokenizer::from_folder((dir / "tokenizer").string());
  InstructionFormat format;
  ASSERT_TRUE(use_folder_template(format, (dir / "tokenizer").string(), tokenizer));
  EXPECT_EQ(format.eos, expected["eot"].get<int64_t>());
  EXPECT_FALSE(format.bos) << "the template writes its own BOS";
  const InstructionSet set = read_instructions((dir / "conversations.jsonl").string(), tokenizer, format);
  ASSERT_EQ(set.examples.size(), expected["examples"].size());
  for (size_t i = 0; i < set.examples.size(); ++i) {
    SCOPED_TRACE("conversation " + std::to_string(i));
    EXPECT_EQ(set.examples[i].tokens, expected["examples"][i]["ids"].get<std::vector<int64_t>>());
    const auto assistant = expected["examples"][i]["assistant"].get<std::vector<int64_t>>();
    EXPECT_EQ(std::vector<int64_t>(set.examples[i].learned.begin(), set.examples[i].learned.end()), assistant);
    EXPECT_GT(set.examples[i].learned_count(), 0);
  }
  EXPECT_EQ(prompt_tokens("What is 2 + 2?", tokenizer, format), expected["question"].get<std::vector<int64_t>>());
}

TEST(ChatTemplateTest, WhatLiesOutsideTheSubsetIsRefusedNamingTheLine) {
  const auto error = [](const std::string& source) {
    return testing::expected_error([&] { ChatTemplate::parse(source, "tokenizer_config.json").render({{"messages", nlohmann::ordered_json::array()}}); });
  };
  const auto output = [&](const std::string& expression) {
    return error("{{ " + expression + " }}");
  };
  EXPECT_TRUE(testing::Contains(error("a\n{% macro m() %}{% endmacro %}"), "tokenizer_config.json:2: {% macro %} is not part"));
  EXPECT_TRUE(testing::Contains(error("{{ messages | unique }}"), "the filter |unique is not part of the subset"));
  EXPECT_TRUE(testing::Contains(error("{% if true %}open"), "the template ends before {% endif %}"));
  EXPECT_TRUE(testing::Contains(error("\n\n{{ 'x' "), "tokenizer_config.json:3: a '{{' is never closed"));
  EXPECT_TRUE(testing::Contains(error("{{ 1 + 'a' }}"), "'+' needs numbers"));
  EXPECT_TRUE(testing::Contains(error("{{ 'abc'.zfill(5) }}"), "the method .zfill() of abc is not part of the subset"));
  EXPECT_TRUE(testing::Contains(error("{% for m in 99999999999999999999999 %}{% endfor %}"), "the number 99999999999999999999999 is out of range"));
  EXPECT_TRUE(testing::Contains(output(std::string(300, '(') + "1" + std::string(300, ')')), "nest deeper than 200"));
  EXPECT_TRUE(testing::Contains(output("[1, 2] | items"), "|items needs a mapping, found [1, 2]"));
}

}  // namespace
}  // namespace kuafu::io
