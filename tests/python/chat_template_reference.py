"""Chat templates rendered by transformers' own Jinja environment (the one apply_chat_template compiles
templates in: trim_blocks, lstrip_blocks, loop controls, raise_exception, its tojson) for
tests/core/io/chat_template_test.cpp. The templates are written here in the styles today's models use:
a Llama-3 style (header tokens, a system message taken off the front, tools as indented JSON), a ChatML /
Qwen style (a namespace found by walking the messages backwards, reasoning kept only after the last
question), a Mistral style ([INST] with alternation enforced by raise_exception) and an older style
leaning on trim_blocks and lstrip_blocks with no whitespace control at all, plus one of the rest of the
subset (literals, filters, tests, methods, slicing, loop variables).

  chat_template_reference.py build OUT   writes OUT/cases.json: [{"template", "context", "text"} or
                                         {"template", "context", "error"}]
  chat_template_reference.py framed TEXT OUT
                                         a Llama-3-style tokenizer folder OUT/tokenizer (a byte-level BPE trained
                                         on TEXT's lines with the family's special tokens, its chat template
                                         marking the assistant turns with {% generation %}) and
                                         OUT/conversations.jsonl, with OUT/expected.json: transformers'
                                         apply_chat_template ids and assistant masks of each conversation, and
                                         the ids of the first question with the generation prompt
"""
import json
import pathlib
import sys

from transformers.utils.chat_template_utils import _compile_jinja_template

TEMPLATES = {
    "llama3_style": (
        "{{- bos_token }}\n"
        "{%- if messages[0]['role'] == 'system' %}\n"
        "    {%- set system_message = messages[0]['content'] | trim %}\n"
        "    {%- set messages = messages[1:] %}\n"
        "{%- else %}\n"
        "    {%- set system_message = \"\" %}\n"
        "{%- endif %}\n"
        "{%- if tools is defined and tools is not none %}\n"
        "    {{- '<|start_header_id|>system<|end_header_id|>\\n\\n' }}\n"
        "    {{- 'Tools you may call:\\n' }}\n"
        "    {%- for t in tools %}\n"
        "        {{- t | tojson(indent=4) }}\n"
        "        {{- '\\n\\n' }}\n"
        "    {%- endfor %}\n"
        "    {{- system_message + '<|eot_id|>' }}\n"
        "{%- elif system_message %}\n"
        "    {{- '<|start_header_id|>system<|end_header_id|>\\n\\n' + system_message + '<|eot_id|>' }}\n"
        "{%- endif %}\n"
        "{%- for message in messages %}\n"
        "    {{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' + message['content'] | trim + '<|eot_id|>' }}\n"
        "{%- endfor %}\n"
        "{%- if add_generation_prompt %}\n"
        "    {{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}\n"
        "{%- endif %}\n"),
    "chatml_style": (
        "{%- if messages[0].role == 'system' %}\n"
        "{{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}\n"
        "{%- else %}\n"
        "{{- '<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' }}\n"
        "{%- endif %}\n"
        "{%- set ns = namespace(last_question=messages|length - 1, seen=false) %}\n"
        "{%- for message in messages[::-1] %}\n"
        "    {%- set index = (messages|length - 1) - loop.index0 %}\n"
        "    {%- if not ns.seen and message.role == 'user' %}\n"
        "        {%- set ns.last_question = index %}\n"
        "        {%- set ns.seen = true %}\n"
        "    {%- endif %}\n"
        "{%- endfor %}\n"
        "{%- for message in messages %}\n"
        "    {%- if message.role == 'system' and loop.first %}\n"
        "    {%- elif message.role == 'assistant' %}\n"
        "        {%- set content = message.content %}\n"
        "        {%- set reasoning = '' %}\n"
        "        {%- if '</think>' in content %}\n"
        "            {%- set reasoning = content.split('</think>')[0].split('<think>')[-1].strip('\\n') %}\n"
        "            {%- set content = content.split('</think>')[-1].lstrip('\\n') %}\n"
        "        {%- endif %}\n"
        "        {%- if loop.index0 > ns.last_question and reasoning %}\n"
        "{{- '<|im_start|>assistant\\n<think>\\n' + reasoning + '\\n</think>\\n\\n' + content + '<|im_end|>\\n' }}\n"
        "        {%- else %}\n"
        "{{- '<|im_start|>assistant\\n' + content + '<|im_end|>\\n' }}\n"
        "        {%- endif %}\n"
        "    {%- else %}\n"
        "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}\n"
        "    {%- endif %}\n"
        "{%- endfor %}\n"
        "{%- if add_generation_prompt %}\n"
        "{{- '<|im_start|>assistant\\n' }}\n"
        "{%- endif %}\n"),
    "mistral_style": (
        "{%- if messages[0]['role'] == 'system' %}\n"
        "    {%- set system_message = messages[0]['content'] %}\n"
        "    {%- set loop_messages = messages[1:] %}\n"
        "{%- else %}\n"
        "    {%- set loop_messages = messages %}\n"
        "{%- endif %}\n"
        "{{- bos_token }}\n"
        "{%- for message in loop_messages %}\n"
        "    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}\n"
        "        {{- raise_exception('After the optional system message, roles must alternate user/assistant/user/...') }}\n"
        "    {%- endif %}\n"
        "    {%- if message['role'] == 'user' %}\n"
        "        {%- if loop.first and system_message is defined %}\n"
        "            {{- ' [INST] ' + system_message + '\\n\\n' + message['content'] + ' [/INST]' }}\n"
        "        {%- else %}\n"
        "            {{- ' [INST] ' + message['content'] + ' [/INST]' }}\n"
        "        {%- endif %}\n"
        "    {%- elif message['role'] == 'assistant' %}\n"
        "        {{- ' ' + message['content'] + eos_token }}\n"
        "    {%- else %}\n"
        "        {{- raise_exception('Only user and assistant roles are supported after a system message!') }}\n"
        "    {%- endif %}\n"
        "{%- endfor %}\n"),
    "plain_style": (
        "{# no whitespace control: trim_blocks and lstrip_blocks shape every line #}\n"
        "{% for message in messages %}\n"
        "    {% if message['role'] == 'user' %}\n"
        "<|user|>\n"
        "{{ message['content'] }}{{ eos_token }}\n"
        "    {% elif message['role'] == 'system' %}\n"
        "<|system|>\n"
        "{{ message['content'] }}{{ eos_token }}\n"
        "    {% else %}\n"
        "<|assistant|>\n"
        "{{ message['content'] }}{{ eos_token }}\n"
        "    {% endif %}\n"
        "    {% if loop.last and add_generation_prompt %}\n"
        "<|assistant|>\n"
        "    {% endif %}\n"
        "{% endfor %}"),
    "subset": (
        "{%- set d = {'n': 3, 'x': 1.5, 'flag': true, 'none': none, 'list': [1, 'two', 3.25]} %}"
        "{{ d | tojson }}|{{ d.list }}|{{ d['x'] * 2 }}|{{ 7 // 2 }} {{ -7 // 2 }} {{ 7 % 3 }} {{ 7 / 2 }}|"
        "{{ 'a' ~ 1 ~ none }}|{{ d.missing | default('fallback') }}|{{ (d.missing is defined) ~ (d.n is number) }}|"
        "{% for k, v in d.items() if v is not none %}{{ loop.index }}/{{ loop.length }}:{{ k }}={{ v }}{{ ',' if not loop.last }}{% endfor %}|"
        "{{ messages | map(attribute='role') | list if false else messages | length }}|"
        "{{ ['c', 'a', 'b'] | join('-') }}|{{ 'Hello World'.lower().replace('world', 'there') }}|"
        "{{ '  pad  ' | trim }}|{{ 'abcdef'[1:4] }}{{ 'abcdef'[::2] }}{{ 'abcdef'[-2:] }}|"
        "{% for m in messages %}{% if loop.index0 == 1 %}{% continue %}{% endif %}{% if loop.index0 > 2 %}{% break %}{% endif %}"
        "{{ m.role | upper }}{% endfor %}|"
        "{{ 'x' if messages[0].content is string else 'y' }}{{ 'yes' if 'ell' in 'hello' }}{{ 3 in [1, 2, 3] }}|"
        "{{ {'k': 'v'}.get('k') }}{{ {'k': 'v'}.get('z', 'w') }}|{{ 'a,b,,c'.split(',') }}|{{ d.list | tojson(indent=2) }}|"
        "{{ '}}' ~ \"%}\" }}{% if '%}' %}{{ '{\\'x\\': 1}' }}{% endif %}"),
}

CONVERSATIONS = {
    "one_user": [{"role": "user", "content": "What is 2 + 2?"}],
    "system_multi_turn": [
        {"role": "system", "content": "  You answer in one word.  "},
        {"role": "user", "content": "Colour of the sky?"},
        {"role": "assistant", "content": "Blue."},
        {"role": "user", "content": "And of grass — in français? \u00e9t\u00e9 \U0001F33F"},
    ],
    "reasoning": [
        {"role": "user", "content": "Add 17 and 25."},
        {"role": "assistant", "content": "<think>\n17 + 25 = 42\n</think>\n\n42"},
        {"role": "user", "content": "Now double it."},
        {"role": "assistant", "content": "<think>\n42 * 2 = 84\n</think>\n\n84"},
    ],
}

TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather in a city, \u00b0C",
                                            "parameters": {"type": "object", "properties": {
                                                "city": {"type": "string"}, "days": {"type": "integer", "minimum": 1}},
                                                "required": ["city"]}}}]


def build(out):
    out = pathlib.Path(out)
    out.mkdir(parents=True, exist_ok=True)
    cases = []

    def add(name, context):
        try:
            text = _compile_jinja_template(TEMPLATES[name]).render(**context)
            cases.append({"template": name, "context": context, "text": text})
        except Exception as e:  # the template's own raise_exception
            cases.append({"template": name, "context": context, "error": str(e)})

    for name in TEMPLATES:
        for conversation in CONVERSATIONS.values():
            for generation in (False, True):
                add(name, {"messages": conversation, "add_generation_prompt": generation, "bos_token": "<s>",
                           "eos_token": "</s>"})
    add("llama3_style", {"messages": CONVERSATIONS["system_multi_turn"], "add_generation_prompt": True,
                         "bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>", "tools": TOOLS})
    add("mistral_style", {"messages": [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}],
                          "bos_token": "<s>", "eos_token": "</s>"})
    (out / "templates.json").write_text(json.dumps(TEMPLATES, ensure_ascii=False), encoding="utf-8")
    (out / "cases.json").write_text(json.dumps(cases, ensure_ascii=False), encoding="utf-8")
    print(json.dumps({"cases": len(cases), "errors": sum("error" in c for c in cases)}))


FRAMED_TEMPLATE = (
    "{{- bos_token }}\n"
    "{%- for message in messages %}\n"
    "    {{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' }}\n"
    "    {%- if message['role'] == 'assistant' %}\n"
    "        {%- generation %}{{- message['content'] | trim + '<|eot_id|>' }}{%- endgeneration %}\n"
    "    {%- else %}\n"
    "        {{- message['content'] | trim + '<|eot_id|>' }}\n"
    "    {%- endif %}\n"
    "{%- endfor %}\n"
    "{%- if add_generation_prompt %}\n"
    "    {{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}\n"
    "{%- endif %}\n")


def framed(text_path, out):
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import AutoTokenizer
    out = pathlib.Path(out)
    folder = out / "tokenizer"
    folder.mkdir(parents=True, exist_ok=True)
    pattern = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
               r"|\s+(?!\S)|\s+")
    tokenizer = Tokenizer(models.BPE(ignore_merges=True))
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(pattern), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)])
    tokenizer.decoder = decoders.ByteLevel()
    special = ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]
    tokenizer.train([text_path], trainers.BpeTrainer(vocab_size=800, special_tokens=special, show_progress=False,
                                                     initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tokenizer.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>",
        "chat_template": FRAMED_TEMPLATE}))
    auto = AutoTokenizer.from_pretrained(str(folder))
    answered = [c for c in CONVERSATIONS.values() if any(m["role"] == "assistant" for m in c)]
    conversations = answered + [[{"role": "user", "content": "Say hi."},
                                                     {"role": "assistant", "content": "  hi \u00e9t\u00e9 \U0001F642 "}]]
    expected = []
    with open(out / "conversations.jsonl", "w", encoding="utf-8") as lines:
        for messages in conversations:
            lines.write(json.dumps({"messages": messages}, ensure_ascii=False) + "\n")
            framed = auto.apply_chat_template(messages, tokenize=True, return_dict=True, return_assistant_tokens_mask=True)
            expected.append({"ids": framed["input_ids"], "assistant": framed["assistant_masks"]})
    question = auto.apply_chat_template([{"role": "user", "content": "What is 2 + 2?"}], tokenize=True,
                                        add_generation_prompt=True, return_dict=True)["input_ids"]
    (out / "expected.json").write_text(json.dumps({"examples": expected, "question": question,
                                                   "eot": auto.convert_tokens_to_ids("<|eot_id|>")}))
    print(json.dumps({"conversations": len(expected)}))


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "build":
        build(sys.argv[2])
    elif len(sys.argv) == 4 and sys.argv[1] == "framed":
        framed(sys.argv[2], sys.argv[3])
    else:
        sys.exit("usage: chat_template_reference.py build OUT")
