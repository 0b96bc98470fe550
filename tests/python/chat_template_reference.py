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
        "{{ {'k': 'v'}.get('k') }}{{ {'k': 'v'}.get('z', 'w') }}|{{ 'a,b,,c'.split(',') }}|{{ d.list | tojson(indent=2) }}"),
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


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "build":
        build(sys.argv[2])
    else:
        sys.exit("usage: chat_template_reference.py build OUT")
