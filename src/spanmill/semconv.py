"""Attribute names, values, topics and headers that spans and their carriers use.

Spans follow the OpenTelemetry GenAI semantic conventions wherever one exists.
What the conventions lack gets a ``spanmill.`` attribute, and every one of those
is defined and documented here, nowhere else.

Messages
    ``gen_ai.input.messages`` and ``gen_ai.output.messages`` hold JSON text: an
    array of message objects (``{"role": "user", "parts": [{"type": "text",
    "content": "..."}]}``), as the GenAI conventions define them;
    ``gen_ai.system_instructions`` an array of parts (``[{"type": "text",
    "content": "..."}]``), read as one system message (an array of messages, as
    earlier producers wrote it, is read too). A message object in ``gen_ai.input.messages``
    that carries ``"spanmill.message.example": true`` is a few-shot example turn,
    not part of the real conversation: the dataset builder may drop such turns to
    re-target a sample to a shorter prompt (context distillation).

Rewards
    A reward is a span, or a span event named ``gen_ai.evaluation.result``,
    carrying ``gen_ai.evaluation.name`` and a numeric
    ``gen_ai.evaluation.score.value``. With ``gen_ai.response.id`` it belongs to
    the one LLM call that returned that response id; without it, it belongs to the
    whole episode (the trace, or every span sharing its ``spanmill.episode.id``).
    An episode may carry several named rewards (``correct``, ``latency``, ...);
    exactly one of them should set ``spanmill.reward.primary`` to true, and that
    one is what training optimises. ``gen_ai.evaluation.score.label`` and
    ``gen_ai.evaluation.explanation`` are optional and only informative.

Feedback
    Rewards that arrive after an episode (a thumbs-up, a resolved ticket) come
    through ``POST /v1/feedback`` on the gateway or the collector's receiver
    (see :mod:`spanmill.feedback`). Each becomes one reward span named
    ``gen_ai.evaluation.result`` in instrumentation scope ``spanmill.feedback``,
    in the trace of the call it judges, with the comment as
    ``gen_ai.evaluation.explanation``, the caller's free-form
    ``spanmill.feedback.source``, and who sent it: ``spanmill.feedback.principal``
    (the authenticated identity) and ``client.address``.

Episodes and tasks
    An episode is the spans of one trace, or of one ``spanmill.episode.id`` when an
    episode spans several traces. ``spanmill.task.id`` groups episodes that attempt
    the same task, which is what pairs attempts for preference training.
"""

from __future__ import annotations

from typing import Final

# -- OpenTelemetry resource ----------------------------------------------------------
SERVICE_NAME: Final = "service.name"

# -- OpenTelemetry general attributes ------------------------------------------------
# OpenTelemetry's class of the error a failed operation ended with; for a call the
# gateway answered with an HTTP error, its status code.
ERROR_TYPE: Final = "error.type"
# The address of the client that sent a request, as the server saw it.
CLIENT_ADDRESS: Final = "client.address"

# -- GenAI semantic conventions ------------------------------------------------------
GEN_AI_OPERATION_NAME: Final = "gen_ai.operation.name"
GEN_AI_PROVIDER_NAME: Final = "gen_ai.provider.name"
GEN_AI_REQUEST_MODEL: Final = "gen_ai.request.model"
GEN_AI_REQUEST_TEMPERATURE: Final = "gen_ai.request.temperature"
GEN_AI_REQUEST_TOP_P: Final = "gen_ai.request.top_p"
GEN_AI_REQUEST_MAX_TOKENS: Final = "gen_ai.request.max_tokens"
GEN_AI_REQUEST_STOP_SEQUENCES: Final = "gen_ai.request.stop_sequences"
# The tools offered to the model, as a JSON list of OpenAI tool definitions.
GEN_AI_TOOL_DEFINITIONS: Final = "gen_ai.tool.definitions"
GEN_AI_RESPONSE_MODEL: Final = "gen_ai.response.model"
GEN_AI_RESPONSE_ID: Final = "gen_ai.response.id"
GEN_AI_RESPONSE_FINISH_REASONS: Final = "gen_ai.response.finish_reasons"
GEN_AI_USAGE_INPUT_TOKENS: Final = "gen_ai.usage.input_tokens"
GEN_AI_USAGE_OUTPUT_TOKENS: Final = "gen_ai.usage.output_tokens"
GEN_AI_INPUT_MESSAGES: Final = "gen_ai.input.messages"
GEN_AI_OUTPUT_MESSAGES: Final = "gen_ai.output.messages"
GEN_AI_SYSTEM_INSTRUCTIONS: Final = "gen_ai.system_instructions"
GEN_AI_TOOL_NAME: Final = "gen_ai.tool.name"
GEN_AI_TOOL_CALL_ID: Final = "gen_ai.tool.call.id"
GEN_AI_TOOL_CALL_ARGUMENTS: Final = "gen_ai.tool.call.arguments"
GEN_AI_TOOL_CALL_RESULT: Final = "gen_ai.tool.call.result"
GEN_AI_AGENT_NAME: Final = "gen_ai.agent.name"
GEN_AI_CONVERSATION_ID: Final = "gen_ai.conversation.id"

GEN_AI_EVALUATION_NAME: Final = "gen_ai.evaluation.name"
GEN_AI_EVALUATION_SCORE_VALUE: Final = "gen_ai.evaluation.score.value"
GEN_AI_EVALUATION_SCORE_LABEL: Final = "gen_ai.evaluation.score.label"
GEN_AI_EVALUATION_EXPLANATION: Final = "gen_ai.evaluation.explanation"
# The span event that carries one evaluation (reward) of the span it sits on.
GEN_AI_EVALUATION_RESULT_EVENT: Final = "gen_ai.evaluation.result"

# Values of gen_ai.operation.name.
OPERATION_CHAT: Final = "chat"
OPERATION_TEXT_COMPLETION: Final = "text_completion"
# Gemini's call (the Google GenAI and Vertex AI instrumentations record it so).
OPERATION_GENERATE_CONTENT: Final = "generate_content"
OPERATION_EXECUTE_TOOL: Final = "execute_tool"
OPERATION_INVOKE_AGENT: Final = "invoke_agent"
# Operations whose spans are one call to a language model: the samples of a dataset.
LLM_OPERATIONS: Final = frozenset(
    {OPERATION_CHAT, OPERATION_TEXT_COMPLETION, OPERATION_GENERATE_CONTENT}
)

# -- spanmill extensions -------------------------------------------------------------
# Token ids the model produced for the completion (int[]), captured where they are
# known (the gateway, the SDK) so that training never has to re-tokenize text.
SPANMILL_COMPLETION_TOKEN_IDS: Final = "spanmill.completion.token_ids"
# Log-probability of each completion token under the serving model (double[]),
# aligned with spanmill.completion.token_ids.
SPANMILL_COMPLETION_LOGPROBS: Final = "spanmill.completion.logprobs"
# Token ids of the rendered prompt (int[]), chat template applied.
SPANMILL_PROMPT_TOKEN_IDS: Final = "spanmill.prompt.token_ids"
# Version of the served model that answered (the MLflow model version), which
# gen_ai.response.model alone does not say once several versions serve one name.
SPANMILL_MODEL_VERSION: Final = "spanmill.model.version"
# The LoRA adapter a vLLM engine served that version as (absent for the base model
# and for the Python flavour, where a version is a model of its own).
SPANMILL_LORA_NAME: Final = "spanmill.lora.name"
# Who called the gateway: the id of the API key presented ("anonymous" where the
# gateway asks for none). Never the key itself.
SPANMILL_CLIENT_KEY_ID: Final = "spanmill.client.key_id"
# Resource attribute the collector's OTLP receiver sets on every span it takes: the id
# of the key the producer presented ("anonymous" when it asks for none), replacing
# whatever the producer claimed.
SPANMILL_PRODUCER: Final = "spanmill.producer"
# Where the token ids came from: "sampled" (the server's record of what it sampled) or
# "retokenized" (the server gave none: the text tokenised again, which can differ from
# the ids sampled, and no logprobs). Absent: the server's own ids (the Python flavour).
SPANMILL_TOKEN_IDS_SOURCE: Final = "spanmill.token_ids.source"
# The attributes the gateway left off a call's span (string[]) so that it fits in one
# Kafka record (SPANMILL_KAFKA_MAX_MESSAGE_BYTES): the token ids and logprobs first,
# then the prompt's messages. The call is recorded; training re-tokenises its text.
SPANMILL_SPAN_REDUCED: Final = "spanmill.span.reduced"
# "training" on the calls and episodes of RL rollouts (absent on production traffic):
# they go to the rollout topic, never into production datasets or rollout health.
SPANMILL_TRAFFIC: Final = "spanmill.traffic"
TRAFFIC_TRAINING: Final = "training"
ROLLOUTS_TOPIC: Final = "spanmill.rollouts.v1"
# Groups attempts at the same task, across episodes.
SPANMILL_TASK_ID: Final = "spanmill.task.id"
# Groups the spans of one episode when it is not exactly one trace.
SPANMILL_EPISODE_ID: Final = "spanmill.episode.id"
# Bool on a reward: this is the episode's primary reward.
SPANMILL_REWARD_PRIMARY: Final = "spanmill.reward.primary"
# Identity of the prompt template an LLM call was rendered from.
SPANMILL_PROMPT_NAME: Final = "spanmill.prompt.name"
SPANMILL_PROMPT_VERSION: Final = "spanmill.prompt.version"
# Key inside a message object (not a span attribute): the turn is a few-shot example.
SPANMILL_MESSAGE_EXAMPLE: Final = "spanmill.message.example"
# Feedback spans (POST /v1/feedback): where the caller says the feedback came from
# ("thumbs", "ticket-resolved", ...), and who sent it as authenticated by the route
# (the id of the API key checked, "anonymous" when the route takes any caller).
SPANMILL_FEEDBACK_SOURCE: Final = "spanmill.feedback.source"
SPANMILL_FEEDBACK_PRINCIPAL: Final = "spanmill.feedback.principal"
# Instrumentation scope of feedback spans: how readers tell feedback from the rewards
# agents emit while their episodes run.
FEEDBACK_SCOPE: Final = "spanmill.feedback"

# -- Kafka ---------------------------------------------------------------------------
# Messages are keyed by trace id so that one trace stays on one partition, in order.
SPANS_TOPIC: Final = "spanmill.spans.v1"
DLQ_TOPIC: Final = "spanmill.spans.v1.dlq"

# Optional header naming the payload's media type; without it the collector sniffs.
CONTENT_TYPE_HEADER: Final = "content-type"
# Media-type parameter telling which JSON form a payload is: "otlp" or "sdk".
FORMAT_PARAM: Final = "spanmill-format"
CONTENT_TYPE_OTLP_PROTOBUF: Final = "application/x-protobuf"
CONTENT_TYPE_OTLP_JSON: Final = "application/json; spanmill-format=otlp"
CONTENT_TYPE_SDK_JSON: Final = "application/json; spanmill-format=sdk"

# Headers of a dead-lettered message; its value is the original payload, untouched.
DLQ_HEADER_REASON: Final = "spanmill.dlq.reason"  # short code, e.g. "bad_json"
DLQ_HEADER_DETAIL: Final = "spanmill.dlq.detail"  # what is wrong, naming the field
DLQ_HEADER_SOURCE: Final = "spanmill.dlq.source"  # "<topic>/<partition>/<offset>"
DLQ_HEADER_FAILED_AT: Final = "spanmill.dlq.failed_at"  # Unix time, milliseconds
DLQ_HEADER_COLLECTOR: Final = "spanmill.dlq.collector"  # which collector refused it
