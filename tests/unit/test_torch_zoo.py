"""dnnctl.torch.patch on blocks of real models it was not written against (CPU, numpy
backend): GPT-2, BERT, T5, CLIP's text encoder, Swin, ConvNeXt, EfficientNet's MBConv, a
Stable Diffusion UNet up block, Whisper's encoder (as published, and a port on torch's own
modules), Qwen2 / Mistral, DINOv2 with LayerScale, YOLO's SPPF, DETR's decoder,
MobileNetV3's inverted residuals, a RegNetY stage, a DenseNet block and transition (also
checkpointed), SegFormer's Mix Transformer, Wav2Vec2's front end, ConvNeXt V2 and a timm
DeiT-III block. Each is written in plain torch after its published source (cited above it),
at tiny sizes. For each: patched equals eager (eval and train, float32 and float64, every
call form the model takes), the report says what ran where, unpatch restores the model
exactly, a model validated, trained and validated again follows the steps, and weights
loaded, deep copies, pickling, torch.jit.trace and torch.export behave as README promises."""

from __future__ import annotations

import copy
import io
import math
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from types import SimpleNamespace
from typing import Any

import pytest

torch = pytest.importorskip("torch")
dt = pytest.importorskip("dnnctl.torch")

import torch.nn.functional as F  # noqa: E402
import torch.utils.checkpoint as cp  # noqa: E402
from _torch_models import randomize_norms  # noqa: E402
from torch import nn  # noqa: E402

# ----------------------------------------------------------------------------- GPT-2
# huggingface/transformers src/transformers/models/gpt2/modeling_gpt2.py (GPT2Attention,
# GPT2MLP, GPT2Block), src/transformers/pytorch_utils.py (Conv1D),
# src/transformers/activations.py (NewGELUActivation, "gelu_new")


class Conv1D(nn.Module):
    def __init__(self, nf, nx):
        super().__init__()
        self.nf = nf
        self.weight = nn.Parameter(torch.empty(nx, nf))
        self.bias = nn.Parameter(torch.zeros(nf))
        nn.init.normal_(self.weight, std=0.2)
        nn.init.normal_(self.bias, std=0.1)

    def forward(self, x):
        size_out = x.size()[:-1] + (self.nf,)
        x = torch.addmm(self.bias, x.view(-1, x.size(-1)), self.weight)
        x = x.view(size_out)
        return x


class NewGELUActivation(nn.Module):
    def forward(self, input):
        return 0.5 * input * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (
            input + 0.044715 * torch.pow(input, 3.0))))


class GPT2Attention(nn.Module):
    def __init__(self, embed_dim=32, num_heads=4, max_positions=16, pdrop=0.1):
        super().__init__()
        self.register_buffer("bias", torch.tril(torch.ones((max_positions, max_positions),
                                                           dtype=torch.bool)).view(
            1, 1, max_positions, max_positions), persistent=False)
        self.register_buffer("masked_bias", torch.tensor(-1e4), persistent=False)
        self.embed_dim, self.num_heads = embed_dim, num_heads
        self.head_dim = embed_dim // num_heads
        self.split_size = embed_dim
        self.scale_attn_weights = True
        self.c_attn = Conv1D(3 * embed_dim, embed_dim)
        self.c_proj = Conv1D(embed_dim, embed_dim)
        self.attn_dropout = nn.Dropout(pdrop)
        self.resid_dropout = nn.Dropout(pdrop)

    def _attn(self, query, key, value, attention_mask=None):
        attn_weights = torch.matmul(query, key.transpose(-1, -2))
        if self.scale_attn_weights:
            attn_weights = attn_weights / torch.full(
                [], value.size(-1) ** 0.5, dtype=attn_weights.dtype, device=attn_weights.device)
        query_length, key_length = query.size(-2), key.size(-2)
        causal_mask = self.bias[:, :, key_length - query_length: key_length, :key_length]
        mask_value = torch.finfo(attn_weights.dtype).min
        mask_value = torch.full([], mask_value, dtype=attn_weights.dtype).to(attn_weights.device)
        attn_weights = torch.where(causal_mask, attn_weights.to(attn_weights.dtype), mask_value)
        if attention_mask is not None:
            attn_weights = attn_weights + attention_mask
        attn_weights = nn.functional.softmax(attn_weights, dim=-1)
        attn_weights = attn_weights.type(value.dtype)
        attn_weights = self.attn_dropout(attn_weights)
        attn_output = torch.matmul(attn_weights, value)
        return attn_output, attn_weights

    def _split_heads(self, tensor, num_heads, attn_head_size):
        new_shape = tensor.size()[:-1] + (num_heads, attn_head_size)
        tensor = tensor.view(new_shape)
        return tensor.permute(0, 2, 1, 3)

    def _merge_heads(self, tensor, num_heads, attn_head_size):
        tensor = tensor.permute(0, 2, 1, 3).contiguous()
        new_shape = tensor.size()[:-2] + (num_heads * attn_head_size,)
        return tensor.view(new_shape)

    def forward(self, hidden_states, layer_past=None, attention_mask=None, use_cache=False):
        query, key, value = self.c_attn(hidden_states).split(self.split_size, dim=2)
        query = self._split_heads(query, self.num_heads, self.head_dim)
        key = self._split_heads(key, self.num_heads, self.head_dim)
        value = self._split_heads(value, self.num_heads, self.head_dim)
        if layer_past is not None:
            past_key, past_value = layer_past
            key = torch.cat((past_key, key), dim=-2)
            value = torch.cat((past_value, value), dim=-2)
        present = (key, value) if use_cache is True else None
        attn_output, attn_weights = self._attn(query, key, value, attention_mask)
        attn_output = self._merge_heads(attn_output, self.num_heads, self.head_dim)
        attn_output = self.c_proj(attn_output)
        attn_output = self.resid_dropout(attn_output)
        return attn_output, present


class GPT2MLP(nn.Module):
    def __init__(self, intermediate_size=128, embed_dim=32, pdrop=0.1):
        super().__init__()
        self.c_fc = Conv1D(intermediate_size, embed_dim)
        self.c_proj = Conv1D(embed_dim, intermediate_size)
        self.act = NewGELUActivation()
        self.dropout = nn.Dropout(pdrop)

    def forward(self, hidden_states):
        hidden_states = self.c_fc(hidden_states)
        hidden_states = self.act(hidden_states)
        hidden_states = self.c_proj(hidden_states)
        hidden_states = self.dropout(hidden_states)
        return hidden_states


class GPT2Block(nn.Module):
    def __init__(self, hidden_size=32):
        super().__init__()
        self.ln_1 = nn.LayerNorm(hidden_size, eps=1e-5)
        self.attn = GPT2Attention(hidden_size)
        self.ln_2 = nn.LayerNorm(hidden_size, eps=1e-5)
        self.mlp = GPT2MLP(4 * hidden_size, hidden_size)

    def forward(self, hidden_states, layer_past=None, attention_mask=None, use_cache=False):
        residual = hidden_states
        hidden_states = self.ln_1(hidden_states)
        attn_outputs = self.attn(hidden_states, layer_past=layer_past,
                                 attention_mask=attention_mask, use_cache=use_cache)
        attn_output = attn_outputs[0]
        outputs = attn_outputs[1:]
        hidden_states = attn_output + residual
        residual = hidden_states
        hidden_states = self.ln_2(hidden_states)
        feed_forward_hidden_states = self.mlp(hidden_states)
        hidden_states = residual + feed_forward_hidden_states
        if use_cache:
            outputs = (hidden_states,) + outputs
        else:
            outputs = (hidden_states,) + outputs[1:]
        return outputs


# ----------------------------------------------------------------------------- BERT
# huggingface/transformers src/transformers/models/bert/modeling_bert.py (BertSelfAttention,
# BertSelfOutput, BertAttention, BertIntermediate, BertOutput, BertLayer);
# src/transformers/activations.py (GELUActivation, "gelu")


class GELUActivation(nn.Module):
    def __init__(self):
        super().__init__()
        self.act = nn.functional.gelu

    def forward(self, input):
        return self.act(input)


class BertSelfAttention(nn.Module):
    def __init__(self, hidden_size=32, heads=4, pdrop=0.1):
        super().__init__()
        self.num_attention_heads = heads
        self.attention_head_size = hidden_size // heads
        self.all_head_size = self.num_attention_heads * self.attention_head_size
        self.query = nn.Linear(hidden_size, self.all_head_size)
        self.key = nn.Linear(hidden_size, self.all_head_size)
        self.value = nn.Linear(hidden_size, self.all_head_size)
        self.dropout = nn.Dropout(pdrop)

    def transpose_for_scores(self, x):
        new_x_shape = x.size()[:-1] + (self.num_attention_heads, self.attention_head_size)
        x = x.view(new_x_shape)
        return x.permute(0, 2, 1, 3)

    def forward(self, hidden_states, attention_mask=None):
        mixed_query_layer = self.query(hidden_states)
        key_layer = self.transpose_for_scores(self.key(hidden_states))
        value_layer = self.transpose_for_scores(self.value(hidden_states))
        query_layer = self.transpose_for_scores(mixed_query_layer)
        attention_scores = torch.matmul(query_layer, key_layer.transpose(-1, -2))
        attention_scores = attention_scores / math.sqrt(self.attention_head_size)
        if attention_mask is not None:
            attention_scores = attention_scores + attention_mask
        attention_probs = nn.functional.softmax(attention_scores, dim=-1)
        attention_probs = self.dropout(attention_probs)
        context_layer = torch.matmul(attention_probs, value_layer)
        context_layer = context_layer.permute(0, 2, 1, 3).contiguous()
        new_context_layer_shape = context_layer.size()[:-2] + (self.all_head_size,)
        context_layer = context_layer.view(new_context_layer_shape)
        return (context_layer,)


class BertSelfOutput(nn.Module):
    def __init__(self, hidden_size=32, pdrop=0.1):
        super().__init__()
        self.dense = nn.Linear(hidden_size, hidden_size)
        self.LayerNorm = nn.LayerNorm(hidden_size, eps=1e-12)
        self.dropout = nn.Dropout(pdrop)

    def forward(self, hidden_states, input_tensor):
        hidden_states = self.dense(hidden_states)
        hidden_states = self.dropout(hidden_states)
        return self.LayerNorm(hidden_states + input_tensor)


class BertAttention(nn.Module):
    def __init__(self, hidden_size=32):
        super().__init__()
        self.self = BertSelfAttention(hidden_size)
        self.output = BertSelfOutput(hidden_size)

    def forward(self, hidden_states, attention_mask=None):
        self_outputs = self.self(hidden_states, attention_mask)
        attention_output = self.output(self_outputs[0], hidden_states)
        return (attention_output,) + self_outputs[1:]


class BertIntermediate(nn.Module):
    def __init__(self, hidden_size=32, intermediate_size=64):
        super().__init__()
        self.dense = nn.Linear(hidden_size, intermediate_size)
        self.intermediate_act_fn = GELUActivation()

    def forward(self, hidden_states):
        return self.intermediate_act_fn(self.dense(hidden_states))


class BertOutput(nn.Module):
    def __init__(self, hidden_size=32, intermediate_size=64, pdrop=0.1):
        super().__init__()
        self.dense = nn.Linear(intermediate_size, hidden_size)
        self.LayerNorm = nn.LayerNorm(hidden_size, eps=1e-12)
        self.dropout = nn.Dropout(pdrop)

    def forward(self, hidden_states, input_tensor):
        hidden_states = self.dense(hidden_states)
        hidden_states = self.dropout(hidden_states)
        return self.LayerNorm(hidden_states + input_tensor)


class BertLayer(nn.Module):
    def __init__(self, hidden_size=32):
        super().__init__()
        self.attention = BertAttention(hidden_size)
        self.intermediate = BertIntermediate(hidden_size)
        self.output = BertOutput(hidden_size)

    def forward(self, hidden_states, attention_mask=None):
        self_attention_outputs = self.attention(hidden_states, attention_mask)
        attention_output = self_attention_outputs[0]
        outputs = self_attention_outputs[1:]
        intermediate_output = self.intermediate(attention_output)
        layer_output = self.output(intermediate_output, attention_output)
        return (layer_output,) + outputs


def bert_mask(mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """modeling_utils.get_extended_attention_mask: (B, S) 1/0 -> (B, 1, 1, S) additive."""
    ext = mask[:, None, None, :].to(dtype)
    return (1.0 - ext) * torch.finfo(dtype).min


# ----------------------------------------------------------------------------- T5
# huggingface/transformers src/transformers/models/t5/modeling_t5.py (T5LayerNorm,
# T5DenseGatedActDense, T5LayerFF, T5Attention, T5LayerSelfAttention, T5Block)


class T5LayerNorm(nn.Module):
    def __init__(self, hidden_size, eps=1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.variance_epsilon = eps

    def forward(self, hidden_states):
        variance = hidden_states.to(torch.float32).pow(2).mean(-1, keepdim=True)
        hidden_states = hidden_states * torch.rsqrt(variance + self.variance_epsilon)
        if self.weight.dtype in [torch.float16, torch.bfloat16]:
            hidden_states = hidden_states.to(self.weight.dtype)
        return self.weight * hidden_states


class T5DenseGatedActDense(nn.Module):
    def __init__(self, d_model=32, d_ff=64, pdrop=0.1):
        super().__init__()
        self.wi_0 = nn.Linear(d_model, d_ff, bias=False)
        self.wi_1 = nn.Linear(d_model, d_ff, bias=False)
        self.wo = nn.Linear(d_ff, d_model, bias=False)
        self.dropout = nn.Dropout(pdrop)
        self.act = NewGELUActivation()

    def forward(self, hidden_states):
        hidden_gelu = self.act(self.wi_0(hidden_states))
        hidden_linear = self.wi_1(hidden_states)
        hidden_states = hidden_gelu * hidden_linear
        hidden_states = self.dropout(hidden_states)
        if (isinstance(self.wo.weight, torch.Tensor)
                and hidden_states.dtype != self.wo.weight.dtype
                and self.wo.weight.dtype != torch.int8):
            hidden_states = hidden_states.to(self.wo.weight.dtype)
        return self.wo(hidden_states)


class T5LayerFF(nn.Module):
    def __init__(self, d_model=32, pdrop=0.1):
        super().__init__()
        self.DenseReluDense = T5DenseGatedActDense(d_model)
        self.layer_norm = T5LayerNorm(d_model)
        self.dropout = nn.Dropout(pdrop)

    def forward(self, hidden_states):
        forwarded_states = self.layer_norm(hidden_states)
        forwarded_states = self.DenseReluDense(forwarded_states)
        return hidden_states + self.dropout(forwarded_states)


class T5Attention(nn.Module):
    def __init__(self, d_model=32, n_heads=4, has_relative_attention_bias=True,
                 num_buckets=8, max_distance=16, pdrop=0.1):
        super().__init__()
        self.is_decoder = False
        self.has_relative_attention_bias = has_relative_attention_bias
        self.relative_attention_num_buckets = num_buckets
        self.relative_attention_max_distance = max_distance
        self.d_model, self.key_value_proj_dim, self.n_heads = d_model, d_model // n_heads, n_heads
        self.dropout = pdrop
        self.inner_dim = self.n_heads * self.key_value_proj_dim
        self.q = nn.Linear(d_model, self.inner_dim, bias=False)
        self.k = nn.Linear(d_model, self.inner_dim, bias=False)
        self.v = nn.Linear(d_model, self.inner_dim, bias=False)
        self.o = nn.Linear(self.inner_dim, d_model, bias=False)
        if self.has_relative_attention_bias:
            self.relative_attention_bias = nn.Embedding(num_buckets, self.n_heads)

    @staticmethod
    def _relative_position_bucket(relative_position, bidirectional=True, num_buckets=32,
                                  max_distance=128):
        relative_buckets = 0
        if bidirectional:
            num_buckets //= 2
            relative_buckets += (relative_position > 0).to(torch.long) * num_buckets
            relative_position = torch.abs(relative_position)
        else:
            relative_position = -torch.min(relative_position,
                                           torch.zeros_like(relative_position))
        max_exact = num_buckets // 2
        is_small = relative_position < max_exact
        relative_position_if_large = max_exact + (
            torch.log(relative_position.float() / max_exact)
            / math.log(max_distance / max_exact) * (num_buckets - max_exact)).to(torch.long)
        relative_position_if_large = torch.min(
            relative_position_if_large, torch.full_like(relative_position_if_large,
                                                        num_buckets - 1))
        relative_buckets += torch.where(is_small, relative_position, relative_position_if_large)
        return relative_buckets

    def compute_bias(self, query_length, key_length, device=None):
        if device is None:
            device = self.relative_attention_bias.weight.device
        context_position = torch.arange(query_length, dtype=torch.long, device=device)[:, None]
        memory_position = torch.arange(key_length, dtype=torch.long, device=device)[None, :]
        relative_position = memory_position - context_position
        relative_position_bucket = self._relative_position_bucket(
            relative_position, bidirectional=(not self.is_decoder),
            num_buckets=self.relative_attention_num_buckets,
            max_distance=self.relative_attention_max_distance)
        values = self.relative_attention_bias(relative_position_bucket)
        return values.permute([2, 0, 1]).unsqueeze(0)

    def forward(self, hidden_states, mask=None, position_bias=None):
        batch_size, seq_length = hidden_states.shape[:2]

        def shape(states):
            return states.view(batch_size, -1, self.n_heads,
                               self.key_value_proj_dim).transpose(1, 2)

        def unshape(states):
            return states.transpose(1, 2).contiguous().view(batch_size, -1, self.inner_dim)

        query_states = shape(self.q(hidden_states))
        key_states = shape(self.k(hidden_states))
        value_states = shape(self.v(hidden_states))
        scores = torch.matmul(query_states, key_states.transpose(3, 2))
        if position_bias is None:
            position_bias = self.compute_bias(seq_length, seq_length, device=scores.device)
            if mask is not None:
                position_bias = position_bias + mask
        scores += position_bias
        attn_weights = nn.functional.softmax(scores.float(), dim=-1).type_as(scores)
        attn_weights = nn.functional.dropout(attn_weights, p=self.dropout,
                                             training=self.training)
        attn_output = unshape(torch.matmul(attn_weights, value_states))
        attn_output = self.o(attn_output)
        return (attn_output, position_bias)


class T5LayerSelfAttention(nn.Module):
    def __init__(self, d_model=32, pdrop=0.1):
        super().__init__()
        self.SelfAttention = T5Attention(d_model)
        self.layer_norm = T5LayerNorm(d_model)
        self.dropout = nn.Dropout(pdrop)

    def forward(self, hidden_states, attention_mask=None, position_bias=None):
        normed_hidden_states = self.layer_norm(hidden_states)
        attention_output = self.SelfAttention(normed_hidden_states, mask=attention_mask,
                                              position_bias=position_bias)
        hidden_states = hidden_states + self.dropout(attention_output[0])
        return (hidden_states,) + attention_output[1:]


class T5Block(nn.Module):
    def __init__(self, d_model=32):
        super().__init__()
        self.layer = nn.ModuleList([T5LayerSelfAttention(d_model), T5LayerFF(d_model)])

    def forward(self, hidden_states, attention_mask=None, position_bias=None):
        self_attention_outputs = self.layer[0](hidden_states, attention_mask=attention_mask,
                                               position_bias=position_bias)
        hidden_states = self_attention_outputs[0]
        attention_outputs = self_attention_outputs[1:]
        if hidden_states.dtype == torch.float16:
            clamp_value = torch.where(torch.isinf(hidden_states).any(),
                                      torch.finfo(hidden_states.dtype).max - 1000,
                                      torch.finfo(hidden_states.dtype).max)
            hidden_states = torch.clamp(hidden_states, min=-clamp_value, max=clamp_value)
        hidden_states = self.layer[-1](hidden_states)
        return (hidden_states,) + attention_outputs


# ----------------------------------------------------------------------------- CLIP text
# huggingface/transformers src/transformers/models/clip/modeling_clip.py (eager_attention_
# forward, CLIPAttention, CLIPMLP, CLIPEncoderLayer; transformers >= 4.48),
# src/transformers/activations.py (QuickGELUActivation)


class QuickGELUActivation(nn.Module):
    def forward(self, input):
        return input * torch.sigmoid(1.702 * input)


def eager_attention_forward(module, query, key, value, attention_mask, scaling, dropout=0.0,
                            **kwargs):
    attn_weights = torch.matmul(query, key.transpose(-1, -2)) * scaling
    if attention_mask is not None:
        attn_weights = attn_weights + attention_mask
    attn_weights = nn.functional.softmax(attn_weights, dim=-1, dtype=torch.float32).to(
        query.dtype)
    attn_weights = nn.functional.dropout(attn_weights, p=dropout, training=module.training)
    attn_output = torch.matmul(attn_weights, value)
    attn_output = attn_output.transpose(1, 2).contiguous()
    return attn_output, attn_weights


class CLIPAttention(nn.Module):
    def __init__(self, embed_dim=32, num_heads=4, dropout=0.0):
        super().__init__()
        self.embed_dim, self.num_heads = embed_dim, num_heads
        self.head_dim = embed_dim // num_heads
        self.scale = self.head_dim ** -0.5
        self.dropout = dropout
        self.is_causal = False
        self.k_proj = nn.Linear(embed_dim, embed_dim)
        self.v_proj = nn.Linear(embed_dim, embed_dim)
        self.q_proj = nn.Linear(embed_dim, embed_dim)
        self.out_proj = nn.Linear(embed_dim, embed_dim)

    def forward(self, hidden_states, attention_mask=None, causal_attention_mask=None,
                output_attentions=False):
        batch_size, seq_length, embed_dim = hidden_states.shape
        queries = self.q_proj(hidden_states)
        keys = self.k_proj(hidden_states)
        values = self.v_proj(hidden_states)
        queries = queries.view(batch_size, seq_length, -1, self.head_dim).transpose(1, 2)
        keys = keys.view(batch_size, seq_length, -1, self.head_dim).transpose(1, 2)
        values = values.view(batch_size, seq_length, -1, self.head_dim).transpose(1, 2)
        if attention_mask is not None and causal_attention_mask is not None:
            attention_mask = attention_mask + causal_attention_mask
        elif causal_attention_mask is not None:
            attention_mask = causal_attention_mask
        attn_output, attn_weights = eager_attention_forward(
            self, queries, keys, values, attention_mask, is_causal=self.is_causal,
            scaling=self.scale, dropout=0.0 if not self.training else self.dropout)
        attn_output = attn_output.reshape(batch_size, seq_length, embed_dim).contiguous()
        attn_output = self.out_proj(attn_output)
        if not output_attentions:
            attn_weights = None
        return attn_output, attn_weights


class CLIPMLP(nn.Module):
    def __init__(self, hidden_size=32, intermediate_size=64):
        super().__init__()
        self.activation_fn = QuickGELUActivation()
        self.fc1 = nn.Linear(hidden_size, intermediate_size)
        self.fc2 = nn.Linear(intermediate_size, hidden_size)

    def forward(self, hidden_states):
        hidden_states = self.fc1(hidden_states)
        hidden_states = self.activation_fn(hidden_states)
        return self.fc2(hidden_states)


class CLIPEncoderLayer(nn.Module):
    def __init__(self, embed_dim=32):
        super().__init__()
        self.self_attn = CLIPAttention(embed_dim)
        self.layer_norm1 = nn.LayerNorm(embed_dim, eps=1e-5)
        self.mlp = CLIPMLP(embed_dim)
        self.layer_norm2 = nn.LayerNorm(embed_dim, eps=1e-5)

    def forward(self, hidden_states, attention_mask, causal_attention_mask,
                output_attentions=False):
        residual = hidden_states
        hidden_states = self.layer_norm1(hidden_states)
        hidden_states, attn_weights = self.self_attn(
            hidden_states=hidden_states, attention_mask=attention_mask,
            causal_attention_mask=causal_attention_mask, output_attentions=output_attentions)
        hidden_states = residual + hidden_states
        residual = hidden_states
        hidden_states = self.layer_norm2(hidden_states)
        hidden_states = self.mlp(hidden_states)
        hidden_states = residual + hidden_states
        outputs = (hidden_states,)
        if output_attentions:
            outputs += (attn_weights,)
        return outputs


def clip_causal_mask(bsz: int, tgt_len: int, dtype: torch.dtype) -> torch.Tensor:
    """modeling_attn_mask_utils.AttentionMaskConverter._make_causal_mask."""
    mask = torch.full((tgt_len, tgt_len), torch.finfo(dtype).min, dtype=dtype)
    mask_cond = torch.arange(mask.size(-1))
    mask.masked_fill_(mask_cond < (mask_cond + 1).view(mask.size(-1), 1), 0)
    mask = mask.to(dtype)
    return mask[None, None, :, :].expand(bsz, 1, tgt_len, tgt_len)


# ----------------------------------------------------------------------------- Swin
# microsoft/Swin-Transformer models/swin_transformer.py (Mlp, window_partition,
# window_reverse, WindowAttention, SwinTransformerBlock); DropPath from timm


class Mlp(nn.Module):
    def __init__(self, in_features, hidden_features=None, out_features=None,
                 act_layer=nn.GELU, drop=0.):
        super().__init__()
        out_features = out_features or in_features
        hidden_features = hidden_features or in_features
        self.fc1 = nn.Linear(in_features, hidden_features)
        self.act = act_layer()
        self.fc2 = nn.Linear(hidden_features, out_features)
        self.drop = nn.Dropout(drop)

    def forward(self, x):
        x = self.fc1(x)
        x = self.act(x)
        x = self.drop(x)
        x = self.fc2(x)
        x = self.drop(x)
        return x


def window_partition(x, window_size):
    B, H, W, C = x.shape
    x = x.view(B, H // window_size, window_size, W // window_size, window_size, C)
    windows = x.permute(0, 1, 3, 2, 4, 5).contiguous().view(-1, window_size, window_size, C)
    return windows


def window_reverse(windows, window_size, H, W):
    B = int(windows.shape[0] / (H * W / window_size / window_size))
    x = windows.view(B, H // window_size, W // window_size, window_size, window_size, -1)
    x = x.permute(0, 1, 3, 2, 4, 5).contiguous().view(B, H, W, -1)
    return x


class WindowAttention(nn.Module):
    def __init__(self, dim, window_size, num_heads, qkv_bias=True, qk_scale=None,
                 attn_drop=0., proj_drop=0.):
        super().__init__()
        self.dim = dim
        self.window_size = window_size  # Wh, Ww
        self.num_heads = num_heads
        head_dim = dim // num_heads
        self.scale = qk_scale or head_dim ** -0.5
        self.relative_position_bias_table = nn.Parameter(
            torch.zeros((2 * window_size[0] - 1) * (2 * window_size[1] - 1), num_heads))
        coords_h = torch.arange(self.window_size[0])
        coords_w = torch.arange(self.window_size[1])
        coords = torch.stack(torch.meshgrid([coords_h, coords_w], indexing="ij"))
        coords_flatten = torch.flatten(coords, 1)
        relative_coords = coords_flatten[:, :, None] - coords_flatten[:, None, :]
        relative_coords = relative_coords.permute(1, 2, 0).contiguous()
        relative_coords[:, :, 0] += self.window_size[0] - 1
        relative_coords[:, :, 1] += self.window_size[1] - 1
        relative_coords[:, :, 0] *= 2 * self.window_size[1] - 1
        relative_position_index = relative_coords.sum(-1)
        self.register_buffer("relative_position_index", relative_position_index)
        self.qkv = nn.Linear(dim, dim * 3, bias=qkv_bias)
        self.attn_drop = nn.Dropout(attn_drop)
        self.proj = nn.Linear(dim, dim)
        self.proj_drop = nn.Dropout(proj_drop)
        nn.init.trunc_normal_(self.relative_position_bias_table, std=.5)
        self.softmax = nn.Softmax(dim=-1)

    def forward(self, x, mask=None):
        B_, N, C = x.shape
        qkv = self.qkv(x).reshape(B_, N, 3, self.num_heads, C // self.num_heads).permute(
            2, 0, 3, 1, 4)
        q, k, v = qkv[0], qkv[1], qkv[2]
        q = q * self.scale
        attn = (q @ k.transpose(-2, -1))
        relative_position_bias = self.relative_position_bias_table[
            self.relative_position_index.view(-1)].view(
            self.window_size[0] * self.window_size[1], self.window_size[0] * self.window_size[1],
            -1)
        relative_position_bias = relative_position_bias.permute(2, 0, 1).contiguous()
        attn = attn + relative_position_bias.unsqueeze(0)
        if mask is not None:
            nW = mask.shape[0]
            attn = attn.view(B_ // nW, nW, self.num_heads, N, N) + mask.unsqueeze(1).unsqueeze(0)
            attn = attn.view(-1, self.num_heads, N, N)
            attn = self.softmax(attn)
        else:
            attn = self.softmax(attn)
        attn = self.attn_drop(attn)
        x = (attn @ v).transpose(1, 2).reshape(B_, N, C)
        x = self.proj(x)
        x = self.proj_drop(x)
        return x


class DropPath(nn.Module):
    """timm/layers/drop.py DropPath."""

    def __init__(self, drop_prob: float = 0., scale_by_keep: bool = True):
        super().__init__()
        self.drop_prob = drop_prob
        self.scale_by_keep = scale_by_keep

    def forward(self, x):
        if self.drop_prob == 0. or not self.training:
            return x
        keep_prob = 1 - self.drop_prob
        shape = (x.shape[0],) + (1,) * (x.ndim - 1)
        random_tensor = x.new_empty(shape).bernoulli_(keep_prob)
        if keep_prob > 0.0 and self.scale_by_keep:
            random_tensor.div_(keep_prob)
        return x * random_tensor


class SwinTransformerBlock(nn.Module):
    def __init__(self, dim=16, input_resolution=(8, 8), num_heads=2, window_size=4,
                 shift_size=2, mlp_ratio=2., drop_path=0.1):
        super().__init__()
        self.dim, self.input_resolution, self.num_heads = dim, input_resolution, num_heads
        self.window_size, self.shift_size, self.mlp_ratio = window_size, shift_size, mlp_ratio
        self.norm1 = nn.LayerNorm(dim)
        self.attn = WindowAttention(dim, window_size=(window_size, window_size),
                                    num_heads=num_heads)
        self.drop_path = DropPath(drop_path) if drop_path > 0. else nn.Identity()
        self.norm2 = nn.LayerNorm(dim)
        self.mlp = Mlp(in_features=dim, hidden_features=int(dim * mlp_ratio))
        if self.shift_size > 0:
            H, W = self.input_resolution
            img_mask = torch.zeros((1, H, W, 1))
            h_slices = (slice(0, -self.window_size), slice(-self.window_size, -self.shift_size),
                        slice(-self.shift_size, None))
            w_slices = (slice(0, -self.window_size), slice(-self.window_size, -self.shift_size),
                        slice(-self.shift_size, None))
            cnt = 0
            for h in h_slices:
                for w in w_slices:
                    img_mask[:, h, w, :] = cnt
                    cnt += 1
            mask_windows = window_partition(img_mask, self.window_size)
            mask_windows = mask_windows.view(-1, self.window_size * self.window_size)
            attn_mask = mask_windows.unsqueeze(1) - mask_windows.unsqueeze(2)
            attn_mask = attn_mask.masked_fill(attn_mask != 0, -100.0).masked_fill(
                attn_mask == 0, 0.0)
        else:
            attn_mask = None
        self.register_buffer("attn_mask", attn_mask)

    def forward(self, x):
        H, W = self.input_resolution
        B, L, C = x.shape
        assert L == H * W, "input feature has wrong size"
        shortcut = x
        x = self.norm1(x)
        x = x.view(B, H, W, C)
        if self.shift_size > 0:
            shifted_x = torch.roll(x, shifts=(-self.shift_size, -self.shift_size), dims=(1, 2))
        else:
            shifted_x = x
        x_windows = window_partition(shifted_x, self.window_size)
        x_windows = x_windows.view(-1, self.window_size * self.window_size, C)
        attn_windows = self.attn(x_windows, mask=self.attn_mask)
        attn_windows = attn_windows.view(-1, self.window_size, self.window_size, C)
        shifted_x = window_reverse(attn_windows, self.window_size, H, W)
        if self.shift_size > 0:
            x = torch.roll(shifted_x, shifts=(self.shift_size, self.shift_size), dims=(1, 2))
        else:
            x = shifted_x
        x = x.view(B, H * W, C)
        x = shortcut + self.drop_path(x)
        x = x + self.drop_path(self.mlp(self.norm2(x)))
        return x


# ----------------------------------------------------------------------------- ConvNeXt
# pytorch/vision torchvision/models/convnext.py (CNBlock), torchvision/ops/misc.py
# (Permute), torchvision/ops/stochastic_depth.py (stochastic_depth, StochasticDepth)


def stochastic_depth(input, p, mode, training=True):
    if p < 0.0 or p > 1.0:
        raise ValueError(f"drop probability has to be between 0 and 1, but got {p}")
    if mode not in ["batch", "row"]:
        raise ValueError(f"mode has to be either 'batch' or 'row', but got {mode}")
    if not training or p == 0.0:
        return input
    survival_rate = 1.0 - p
    if mode == "row":
        size = [input.shape[0]] + [1] * (input.ndim - 1)
    else:
        size = [1] * input.ndim
    noise = torch.empty(size, dtype=input.dtype, device=input.device)
    noise = noise.bernoulli_(survival_rate)
    if survival_rate > 0.0:
        noise.div_(survival_rate)
    return input * noise


torch.fx.wrap("stochastic_depth")


class StochasticDepth(nn.Module):
    def __init__(self, p: float, mode: str) -> None:
        super().__init__()
        self.p = p
        self.mode = mode

    def forward(self, input):
        return stochastic_depth(input, self.p, self.mode, self.training)


class Permute(nn.Module):
    def __init__(self, dims):
        super().__init__()
        self.dims = dims

    def forward(self, x):
        return torch.permute(x, self.dims)


class CNBlock(nn.Module):
    def __init__(self, dim=16, layer_scale=0.5, stochastic_depth_prob=0.1, norm_layer=None):
        super().__init__()
        if norm_layer is None:
            norm_layer = partial(nn.LayerNorm, eps=1e-6)
        self.block = nn.Sequential(
            nn.Conv2d(dim, dim, kernel_size=7, padding=3, groups=dim, bias=True),
            Permute([0, 2, 3, 1]),
            norm_layer(dim),
            nn.Linear(in_features=dim, out_features=4 * dim, bias=True),
            nn.GELU(),
            nn.Linear(in_features=4 * dim, out_features=dim, bias=True),
            Permute([0, 3, 1, 2]),
        )
        self.layer_scale = nn.Parameter(torch.ones(dim, 1, 1) * layer_scale)
        self.stochastic_depth = StochasticDepth(stochastic_depth_prob, "row")

    def forward(self, input):
        result = self.layer_scale * self.block(input)
        result = self.stochastic_depth(result)
        result += input
        return result


# ----------------------------------------------------------------------------- EfficientNet
# pytorch/vision torchvision/models/efficientnet.py (MBConv), torchvision/ops/misc.py
# (Conv2dNormActivation, SqueezeExcitation)


class Conv2dNormActivation(nn.Sequential):
    def __init__(self, in_channels, out_channels, kernel_size=3, stride=1, padding=None,
                 groups=1, norm_layer=nn.BatchNorm2d, activation_layer=nn.ReLU, dilation=1,
                 inplace=True, bias=None):
        if padding is None:
            padding = (kernel_size - 1) // 2 * dilation
        if bias is None:
            bias = norm_layer is None
        layers = [nn.Conv2d(in_channels, out_channels, kernel_size, stride, padding,
                            dilation=dilation, groups=groups, bias=bias)]
        if norm_layer is not None:
            layers.append(norm_layer(out_channels))
        if activation_layer is not None:
            params = {} if inplace is None else {"inplace": inplace}
            layers.append(activation_layer(**params))
        super().__init__(*layers)
        self.out_channels = out_channels


class SqueezeExcitation(nn.Module):
    def __init__(self, input_channels, squeeze_channels, activation=nn.ReLU,
                 scale_activation=nn.Sigmoid):
        super().__init__()
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc1 = nn.Conv2d(input_channels, squeeze_channels, 1)
        self.fc2 = nn.Conv2d(squeeze_channels, input_channels, 1)
        self.activation = activation()
        self.scale_activation = scale_activation()

    def _scale(self, input):
        scale = self.avgpool(input)
        scale = self.fc1(scale)
        scale = self.activation(scale)
        scale = self.fc2(scale)
        return self.scale_activation(scale)

    def forward(self, input):
        scale = self._scale(input)
        return scale * input


class MBConv(nn.Module):
    def __init__(self, input_channels=8, expand_ratio=4, kernel=3, stride=1,
                 out_channels=8, stochastic_depth_prob=0.1, norm_layer=nn.BatchNorm2d):
        super().__init__()
        self.use_res_connect = stride == 1 and input_channels == out_channels
        layers = []
        activation_layer = nn.SiLU
        expanded_channels = input_channels * expand_ratio
        if expanded_channels != input_channels:
            layers.append(Conv2dNormActivation(input_channels, expanded_channels, kernel_size=1,
                                               norm_layer=norm_layer,
                                               activation_layer=activation_layer))
        layers.append(Conv2dNormActivation(expanded_channels, expanded_channels,
                                           kernel_size=kernel, stride=stride,
                                           groups=expanded_channels, norm_layer=norm_layer,
                                           activation_layer=activation_layer))
        squeeze_channels = max(1, input_channels // 4)
        layers.append(SqueezeExcitation(expanded_channels, squeeze_channels,
                                        activation=partial(nn.SiLU, inplace=True)))
        layers.append(Conv2dNormActivation(expanded_channels, out_channels, kernel_size=1,
                                           norm_layer=norm_layer, activation_layer=None))
        self.block = nn.Sequential(*layers)
        self.stochastic_depth = StochasticDepth(stochastic_depth_prob, "row")
        self.out_channels = out_channels

    def forward(self, input):
        result = self.block(input)
        if self.use_res_connect:
            result = self.stochastic_depth(result)
            result += input
        return result


# ----------------------------------------------------------------------------- SD UNet
# huggingface/diffusers src/diffusers/models/resnet.py (ResnetBlock2D, "default" time
# embedding norm), src/diffusers/models/unets/unet_2d_blocks.py (UpBlock2D: the skip's cat,
# the resnet, the upsampler: nearest x2 and a 3x3 conv, as CompVis/stable-diffusion
# ldm/modules/diffusionmodules/openaimodel.py's Upsample, here nn.Upsample: both published
# upsamplers test the input's shape or dtype in Python, which fx cannot trace)


class ResnetBlock2D(nn.Module):
    def __init__(self, *, in_channels, out_channels=None, dropout=0.0, temb_channels=16,
                 groups=32, eps=1e-6, output_scale_factor=1.0):
        super().__init__()
        self.in_channels = in_channels
        out_channels = in_channels if out_channels is None else out_channels
        self.out_channels = out_channels
        self.output_scale_factor = output_scale_factor
        self.time_embedding_norm = "default"
        self.skip_time_act = False
        self.norm1 = nn.GroupNorm(num_groups=groups, num_channels=in_channels, eps=eps,
                                  affine=True)
        self.conv1 = nn.Conv2d(in_channels, out_channels, kernel_size=3, stride=1, padding=1)
        self.time_emb_proj = nn.Linear(temb_channels, out_channels)
        self.norm2 = nn.GroupNorm(num_groups=groups, num_channels=out_channels, eps=eps,
                                  affine=True)
        self.dropout = nn.Dropout(dropout)
        self.conv2 = nn.Conv2d(out_channels, out_channels, kernel_size=3, stride=1, padding=1)
        self.nonlinearity = nn.SiLU()
        self.upsample = self.downsample = None
        self.use_in_shortcut = self.in_channels != out_channels
        self.conv_shortcut = None
        if self.use_in_shortcut:
            self.conv_shortcut = nn.Conv2d(in_channels, out_channels, kernel_size=1, stride=1,
                                           padding=0, bias=True)

    def forward(self, input_tensor, temb, *args, **kwargs):
        hidden_states = input_tensor
        hidden_states = self.norm1(hidden_states)
        hidden_states = self.nonlinearity(hidden_states)
        hidden_states = self.conv1(hidden_states)
        if self.time_emb_proj is not None:
            if not self.skip_time_act:
                temb = self.nonlinearity(temb)
            temb = self.time_emb_proj(temb)[:, :, None, None]
        if self.time_embedding_norm == "default":
            if temb is not None:
                hidden_states = hidden_states + temb
            hidden_states = self.norm2(hidden_states)
        hidden_states = self.nonlinearity(hidden_states)
        hidden_states = self.dropout(hidden_states)
        hidden_states = self.conv2(hidden_states)
        if self.conv_shortcut is not None:
            input_tensor = self.conv_shortcut(input_tensor.contiguous())
        output_tensor = (input_tensor + hidden_states) / self.output_scale_factor
        return output_tensor


class SDUpBlock(nn.Module):
    """UpBlock2D with one resnet: cat the skip, ResnetBlock2D(temb), Upsample."""

    def __init__(self, channels=32, skip_channels=32, temb_channels=16):
        super().__init__()
        self.resnets = nn.ModuleList([ResnetBlock2D(in_channels=channels + skip_channels,
                                                    out_channels=channels,
                                                    temb_channels=temb_channels)])
        self.upsamplers = nn.ModuleList([nn.Upsample(scale_factor=2, mode="nearest"),
                                         nn.Conv2d(channels, channels, 3, padding=1)])

    def forward(self, hidden_states, res_hidden_states, temb):
        for resnet in self.resnets:
            hidden_states = torch.cat([hidden_states, res_hidden_states], dim=1)
            hidden_states = resnet(hidden_states, temb)
        for up in self.upsamplers:
            hidden_states = up(hidden_states)
        return hidden_states


# ----------------------------------------------------------------------------- Whisper
# openai/whisper whisper/model.py (LayerNorm, Linear, Conv1d, sinusoids,
# MultiHeadAttention, ResidualAttentionBlock, AudioEncoder)


class WLayerNorm(nn.LayerNorm):
    def forward(self, x):
        return super().forward(x.float()).type(x.dtype)


class WLinear(nn.Linear):
    def forward(self, x):
        return F.linear(x, self.weight.to(x.dtype),
                        None if self.bias is None else self.bias.to(x.dtype))


class WConv1d(nn.Conv1d):
    def _conv_forward(self, x, weight, bias):
        return super()._conv_forward(x, weight.to(x.dtype),
                                     None if bias is None else bias.to(x.dtype))


def sinusoids(length, channels, max_timescale=10000):
    log_timescale_increment = math.log(max_timescale) / (channels // 2 - 1)
    inv_timescales = torch.exp(-log_timescale_increment * torch.arange(channels // 2))
    scaled_time = torch.arange(length)[:, None] * inv_timescales[None, :]
    return torch.cat([torch.sin(scaled_time), torch.cos(scaled_time)], dim=1)


class WMultiHeadAttention(nn.Module):
    use_sdpa = True

    def __init__(self, n_state, n_head):
        super().__init__()
        self.n_head = n_head
        self.query = WLinear(n_state, n_state)
        self.key = WLinear(n_state, n_state, bias=False)
        self.value = WLinear(n_state, n_state)
        self.out = WLinear(n_state, n_state)

    def forward(self, x, xa=None, mask=None, kv_cache=None):
        q = self.query(x)
        k = self.key(x if xa is None else xa)
        v = self.value(x if xa is None else xa)
        wv, qk = self.qkv_attention(q, k, v, mask)
        return self.out(wv), qk

    def qkv_attention(self, q, k, v, mask=None):
        n_batch, n_ctx, n_state = q.shape
        q = q.view(*q.shape[:2], self.n_head, -1).permute(0, 2, 1, 3)
        k = k.view(*k.shape[:2], self.n_head, -1).permute(0, 2, 1, 3)
        v = v.view(*v.shape[:2], self.n_head, -1).permute(0, 2, 1, 3)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=mask is not None and n_ctx > 1)
        out = a.permute(0, 2, 1, 3).flatten(start_dim=2)
        return out, None


class ResidualAttentionBlock(nn.Module):
    def __init__(self, n_state, n_head):
        super().__init__()
        self.attn = WMultiHeadAttention(n_state, n_head)
        self.attn_ln = WLayerNorm(n_state)
        n_mlp = n_state * 4
        self.mlp = nn.Sequential(WLinear(n_state, n_mlp), nn.GELU(), WLinear(n_mlp, n_state))
        self.mlp_ln = WLayerNorm(n_state)

    def forward(self, x, xa=None, mask=None, kv_cache=None):
        x = x + self.attn(self.attn_ln(x), mask=mask, kv_cache=kv_cache)[0]
        x = x + self.mlp(self.mlp_ln(x))
        return x


class AudioEncoder(nn.Module):
    def __init__(self, n_mels=8, n_ctx=6, n_state=16, n_head=2, n_layer=1):
        super().__init__()
        self.conv1 = WConv1d(n_mels, n_state, kernel_size=3, padding=1)
        self.conv2 = WConv1d(n_state, n_state, kernel_size=3, stride=2, padding=1)
        self.register_buffer("positional_embedding", sinusoids(n_ctx, n_state))
        self.blocks = nn.ModuleList([ResidualAttentionBlock(n_state, n_head)
                                     for _ in range(n_layer)])
        self.ln_post = WLayerNorm(n_state)

    def forward(self, x):
        x = F.gelu(self.conv1(x))
        x = F.gelu(self.conv2(x))
        x = x.permute(0, 2, 1)
        assert x.shape[1:] == self.positional_embedding.shape, "incorrect audio shape"
        x = (x + self.positional_embedding).to(x.dtype)
        for block in self.blocks:
            x = block(x)
        x = self.ln_post(x)
        return x


class WhisperFront(nn.Module):
    """The same front end with torch's own modules (a port that drops the dtype-casting
    subclasses, as most re-implementations do): conv1d + F.gelu twice, positions added."""

    def __init__(self, n_mels=8, n_ctx=6, n_state=16):
        super().__init__()
        self.conv1 = nn.Conv1d(n_mels, n_state, kernel_size=3, padding=1)
        self.conv2 = nn.Conv1d(n_state, n_state, kernel_size=3, stride=2, padding=1)
        self.register_buffer("positional_embedding", sinusoids(n_ctx, n_state))
        self.ln_post = nn.LayerNorm(n_state)

    def forward(self, x):
        x = F.gelu(self.conv1(x))
        x = F.gelu(self.conv2(x))
        x = x.permute(0, 2, 1)
        x = (x + self.positional_embedding).to(x.dtype)
        return self.ln_post(x)


# ----------------------------------------------------------------------------- Mistral / Qwen2
# huggingface/transformers src/transformers/models/mistral/modeling_mistral.py and
# models/qwen2/modeling_qwen2.py (RMSNorm, RotaryEmbedding, rotate_half,
# apply_rotary_pos_emb, repeat_kv, eager_attention_forward, Attention, MLP, DecoderLayer)


class Qwen2RMSNorm(nn.Module):
    def __init__(self, hidden_size, eps=1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.variance_epsilon = eps

    def forward(self, hidden_states):
        input_dtype = hidden_states.dtype
        hidden_states = hidden_states.to(torch.float32)
        variance = hidden_states.pow(2).mean(-1, keepdim=True)
        hidden_states = hidden_states * torch.rsqrt(variance + self.variance_epsilon)
        return self.weight * hidden_states.to(input_dtype)


class Qwen2RotaryEmbedding(nn.Module):
    def __init__(self, dim, base=10000.0):
        super().__init__()
        inv_freq = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))
        self.register_buffer("inv_freq", inv_freq, persistent=False)
        self.attention_scaling = 1.0

    @torch.no_grad()
    def forward(self, x, position_ids):
        inv_freq_expanded = self.inv_freq[None, :, None].float().expand(
            position_ids.shape[0], -1, 1).to(x.device)
        position_ids_expanded = position_ids[:, None, :].float()
        device_type = x.device.type if isinstance(x.device.type, str) and \
            x.device.type != "mps" else "cpu"
        with torch.autocast(device_type=device_type, enabled=False):
            freqs = (inv_freq_expanded.float() @ position_ids_expanded.float()).transpose(1, 2)
            emb = torch.cat((freqs, freqs), dim=-1)
            cos = emb.cos() * self.attention_scaling
            sin = emb.sin() * self.attention_scaling
        return cos.to(dtype=x.dtype), sin.to(dtype=x.dtype)


def rotate_half(x):
    x1 = x[..., : x.shape[-1] // 2]
    x2 = x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), dim=-1)


def apply_rotary_pos_emb(q, k, cos, sin, position_ids=None, unsqueeze_dim=1):
    cos = cos.unsqueeze(unsqueeze_dim)
    sin = sin.unsqueeze(unsqueeze_dim)
    q_embed = (q * cos) + (rotate_half(q) * sin)
    k_embed = (k * cos) + (rotate_half(k) * sin)
    return q_embed, k_embed


def repeat_kv(hidden_states, n_rep):
    batch, num_key_value_heads, slen, head_dim = hidden_states.shape
    if n_rep == 1:
        return hidden_states
    hidden_states = hidden_states[:, :, None, :, :].expand(batch, num_key_value_heads, n_rep,
                                                           slen, head_dim)
    return hidden_states.reshape(batch, num_key_value_heads * n_rep, slen, head_dim)


def qwen_eager_attention_forward(module, query, key, value, attention_mask, scaling,
                                 dropout=0.0, **kwargs):
    key_states = repeat_kv(key, module.num_key_value_groups)
    value_states = repeat_kv(value, module.num_key_value_groups)
    attn_weights = torch.matmul(query, key_states.transpose(2, 3)) * scaling
    if attention_mask is not None:
        causal_mask = attention_mask[:, :, :, : key_states.shape[-2]]
        attn_weights = attn_weights + causal_mask
    attn_weights = nn.functional.softmax(attn_weights, dim=-1, dtype=torch.float32).to(
        query.dtype)
    attn_weights = nn.functional.dropout(attn_weights, p=dropout, training=module.training)
    attn_output = torch.matmul(attn_weights, value_states)
    attn_output = attn_output.transpose(1, 2).contiguous()
    return attn_output, attn_weights


class Qwen2Attention(nn.Module):
    def __init__(self, hidden_size=32, num_heads=4, num_key_value_heads=2, sliding_window=4):
        super().__init__()
        self.head_dim = hidden_size // num_heads
        self.num_key_value_groups = num_heads // num_key_value_heads
        self.scaling = self.head_dim ** -0.5
        self.attention_dropout = 0.0
        self.is_causal = True
        self.q_proj = nn.Linear(hidden_size, num_heads * self.head_dim, bias=True)
        self.k_proj = nn.Linear(hidden_size, num_key_value_heads * self.head_dim, bias=True)
        self.v_proj = nn.Linear(hidden_size, num_key_value_heads * self.head_dim, bias=True)
        self.o_proj = nn.Linear(num_heads * self.head_dim, hidden_size, bias=False)
        self.sliding_window = sliding_window

    def forward(self, hidden_states, position_embeddings, attention_mask,
                past_key_value=None, cache_position=None, **kwargs):
        input_shape = hidden_states.shape[:-1]
        hidden_shape = (*input_shape, -1, self.head_dim)
        query_states = self.q_proj(hidden_states).view(hidden_shape).transpose(1, 2)
        key_states = self.k_proj(hidden_states).view(hidden_shape).transpose(1, 2)
        value_states = self.v_proj(hidden_states).view(hidden_shape).transpose(1, 2)
        cos, sin = position_embeddings
        query_states, key_states = apply_rotary_pos_emb(query_states, key_states, cos, sin)
        attn_output, attn_weights = qwen_eager_attention_forward(
            self, query_states, key_states, value_states, attention_mask,
            dropout=0.0 if not self.training else self.attention_dropout,
            scaling=self.scaling, sliding_window=self.sliding_window, **kwargs)
        attn_output = attn_output.reshape(*input_shape, -1).contiguous()
        attn_output = self.o_proj(attn_output)
        return attn_output, attn_weights


class Qwen2MLP(nn.Module):
    def __init__(self, hidden_size=32, intermediate_size=48):
        super().__init__()
        self.gate_proj = nn.Linear(hidden_size, intermediate_size, bias=False)
        self.up_proj = nn.Linear(hidden_size, intermediate_size, bias=False)
        self.down_proj = nn.Linear(intermediate_size, hidden_size, bias=False)
        self.act_fn = nn.SiLU()

    def forward(self, x):
        return self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))


class Qwen2DecoderLayer(nn.Module):
    def __init__(self, hidden_size=32):
        super().__init__()
        self.self_attn = Qwen2Attention(hidden_size)
        self.mlp = Qwen2MLP(hidden_size)
        self.input_layernorm = Qwen2RMSNorm(hidden_size)
        self.post_attention_layernorm = Qwen2RMSNorm(hidden_size)

    def forward(self, hidden_states, attention_mask=None, position_ids=None,
                past_key_value=None, use_cache=False, cache_position=None,
                position_embeddings=None, **kwargs):
        residual = hidden_states
        hidden_states = self.input_layernorm(hidden_states)
        hidden_states, self_attn_weights = self.self_attn(
            hidden_states=hidden_states, attention_mask=attention_mask,
            position_ids=position_ids, past_key_value=past_key_value, use_cache=use_cache,
            cache_position=cache_position, position_embeddings=position_embeddings, **kwargs)
        hidden_states = residual + hidden_states
        residual = hidden_states
        hidden_states = self.post_attention_layernorm(hidden_states)
        hidden_states = self.mlp(hidden_states)
        hidden_states = residual + hidden_states
        return (hidden_states,)


class Qwen2Tiny(nn.Module):
    """Qwen2Model's layer loop with one layer: rotary embeddings once, each layer, norm."""

    def __init__(self, hidden_size=32):
        super().__init__()
        self.layers = nn.ModuleList([Qwen2DecoderLayer(hidden_size)])
        self.norm = Qwen2RMSNorm(hidden_size)
        self.rotary_emb = Qwen2RotaryEmbedding(hidden_size // 4)

    def forward(self, inputs_embeds, attention_mask, position_ids):
        hidden_states = inputs_embeds
        position_embeddings = self.rotary_emb(hidden_states, position_ids)
        for decoder_layer in self.layers:
            layer_outputs = decoder_layer(hidden_states, attention_mask=attention_mask,
                                          position_ids=position_ids,
                                          position_embeddings=position_embeddings)
            hidden_states = layer_outputs[0]
        return self.norm(hidden_states)


def sliding_window_mask(b: int, s: int, window: int, dtype: torch.dtype) -> torch.Tensor:
    """A causal mask that also hides keys more than ``window`` back (Mistral's sliding
    window), additive, (B, 1, S, S)."""
    i = torch.arange(s)
    allowed = (i[None, :] <= i[:, None]) & (i[None, :] > i[:, None] - window)
    mask = torch.zeros(s, s, dtype=dtype).masked_fill(~allowed, torch.finfo(dtype).min)
    return mask[None, None].expand(b, 1, s, s)


# ----------------------------------------------------------------------------- DINOv2
# facebookresearch/dinov2 dinov2/layers/layer_scale.py (LayerScale), attention.py
# (Attention), mlp.py (Mlp), block.py (Block, eval / no sample drop path)


class LayerScale(nn.Module):
    def __init__(self, dim, init_values=1e-5, inplace=False):
        super().__init__()
        self.inplace = inplace
        self.gamma = nn.Parameter(init_values * torch.ones(dim))

    def forward(self, x):
        return x.mul_(self.gamma) if self.inplace else x * self.gamma


class DinoAttention(nn.Module):
    def __init__(self, dim, num_heads=8, qkv_bias=False, proj_bias=True, attn_drop=0.0,
                 proj_drop=0.0):
        super().__init__()
        self.num_heads = num_heads
        head_dim = dim // num_heads
        self.scale = head_dim ** -0.5
        self.qkv = nn.Linear(dim, dim * 3, bias=qkv_bias)
        self.attn_drop = nn.Dropout(attn_drop)
        self.proj = nn.Linear(dim, dim, bias=proj_bias)
        self.proj_drop = nn.Dropout(proj_drop)

    def forward(self, x):
        B, N, C = x.shape
        qkv = self.qkv(x).reshape(B, N, 3, self.num_heads, C // self.num_heads).permute(
            2, 0, 3, 1, 4)
        q, k, v = qkv[0] * self.scale, qkv[1], qkv[2]
        attn = q @ k.transpose(-2, -1)
        attn = attn.softmax(dim=-1)
        attn = self.attn_drop(attn)
        x = (attn @ v).transpose(1, 2).reshape(B, N, C)
        x = self.proj(x)
        x = self.proj_drop(x)
        return x


class DinoBlock(nn.Module):
    def __init__(self, dim=32, num_heads=4, mlp_ratio=2.0, init_values=0.5, inplace=False):
        super().__init__()
        self.norm1 = nn.LayerNorm(dim, eps=1e-6)
        self.attn = DinoAttention(dim, num_heads=num_heads, qkv_bias=True)
        self.ls1 = LayerScale(dim, init_values=init_values, inplace=inplace)
        self.drop_path1 = nn.Identity()
        self.norm2 = nn.LayerNorm(dim, eps=1e-6)
        self.mlp = Mlp(in_features=dim, hidden_features=int(dim * mlp_ratio))
        self.ls2 = LayerScale(dim, init_values=init_values, inplace=inplace)
        self.drop_path2 = nn.Identity()
        self.sample_drop_ratio = 0.0

    def forward(self, x):
        def attn_residual_func(x):
            return self.ls1(self.attn(self.norm1(x)))

        def ffn_residual_func(x):
            return self.ls2(self.mlp(self.norm2(x)))

        if self.training and self.sample_drop_ratio > 0.0:
            # (the published block's two sample drop-path branches; the zoo's ratio is 0)
            raise NotImplementedError
        x = x + attn_residual_func(x)
        x = x + ffn_residual_func(x)
        return x


# ----------------------------------------------------------------------------- YOLO SPPF
# ultralytics/ultralytics ultralytics/nn/modules/conv.py (autopad, Conv),
# ultralytics/nn/modules/block.py (SPPF)


def autopad(k, p=None, d=1):
    if d > 1:
        k = d * (k - 1) + 1 if isinstance(k, int) else [d * (x - 1) + 1 for x in k]
    if p is None:
        p = k // 2 if isinstance(k, int) else [x // 2 for x in k]
    return p


class Conv(nn.Module):
    default_act = nn.SiLU()

    def __init__(self, c1, c2, k=1, s=1, p=None, g=1, d=1, act=True):
        super().__init__()
        self.conv = nn.Conv2d(c1, c2, k, s, autopad(k, p, d), groups=g, dilation=d, bias=False)
        self.bn = nn.BatchNorm2d(c2)
        self.act = self.default_act if act is True else act if isinstance(
            act, nn.Module) else nn.Identity()

    def forward(self, x):
        return self.act(self.bn(self.conv(x)))


class SPPF(nn.Module):
    def __init__(self, c1=16, c2=16, k=5):
        super().__init__()
        c_ = c1 // 2
        self.cv1 = Conv(c1, c_, 1, 1)
        self.cv2 = Conv(c_ * 4, c2, 1, 1)
        self.m = nn.MaxPool2d(kernel_size=k, stride=1, padding=k // 2)

    def forward(self, x):
        y = [self.cv1(x)]
        y.extend(self.m(y[-1]) for _ in range(3))
        return self.cv2(torch.cat(y, 1))


# ----------------------------------------------------------------------------- DETR
# facebookresearch/detr models/transformer.py (TransformerDecoderLayer, forward_post)


class DetrDecoderLayer(nn.Module):
    def __init__(self, d_model=32, nhead=4, dim_feedforward=64, dropout=0.1,
                 normalize_before=False):
        super().__init__()
        self.self_attn = nn.MultiheadAttention(d_model, nhead, dropout=dropout)
        self.multihead_attn = nn.MultiheadAttention(d_model, nhead, dropout=dropout)
        self.linear1 = nn.Linear(d_model, dim_feedforward)
        self.dropout = nn.Dropout(dropout)
        self.linear2 = nn.Linear(dim_feedforward, d_model)
        self.norm1 = nn.LayerNorm(d_model)
        self.norm2 = nn.LayerNorm(d_model)
        self.norm3 = nn.LayerNorm(d_model)
        self.dropout1 = nn.Dropout(dropout)
        self.dropout2 = nn.Dropout(dropout)
        self.dropout3 = nn.Dropout(dropout)
        self.activation = F.relu
        self.normalize_before = normalize_before

    def with_pos_embed(self, tensor, pos):
        return tensor if pos is None else tensor + pos

    def forward_post(self, tgt, memory, tgt_mask=None, memory_mask=None,
                     tgt_key_padding_mask=None, memory_key_padding_mask=None, pos=None,
                     query_pos=None):
        q = k = self.with_pos_embed(tgt, query_pos)
        tgt2 = self.self_attn(q, k, value=tgt, attn_mask=tgt_mask,
                              key_padding_mask=tgt_key_padding_mask)[0]
        tgt = tgt + self.dropout1(tgt2)
        tgt = self.norm1(tgt)
        tgt2 = self.multihead_attn(query=self.with_pos_embed(tgt, query_pos),
                                   key=self.with_pos_embed(memory, pos), value=memory,
                                   attn_mask=memory_mask,
                                   key_padding_mask=memory_key_padding_mask)[0]
        tgt = tgt + self.dropout2(tgt2)
        tgt = self.norm2(tgt)
        tgt2 = self.linear2(self.dropout(self.activation(self.linear1(tgt))))
        tgt = tgt + self.dropout3(tgt2)
        tgt = self.norm3(tgt)
        return tgt

    def forward(self, tgt, memory, tgt_mask=None, memory_mask=None, tgt_key_padding_mask=None,
                memory_key_padding_mask=None, pos=None, query_pos=None):
        return self.forward_post(tgt, memory, tgt_mask, memory_mask, tgt_key_padding_mask,
                                 memory_key_padding_mask, pos, query_pos)


# ----------------------------------------------------------------------------- MobileNetV3
# pytorch/vision torchvision/models/mobilenetv3.py (InvertedResidualConfig, InvertedResidual,
# MobileNetV3's BatchNorm), torchvision/models/_utils.py (_make_divisible); the SE layer is
# torchvision/ops/misc.py's SqueezeExcitation (above) with scale_activation=nn.Hardsigmoid


def _make_divisible(v, divisor, min_value=None):
    if min_value is None:
        min_value = divisor
    new_v = max(min_value, int(v + divisor / 2) // divisor * divisor)
    if new_v < 0.9 * v:
        new_v += divisor
    return new_v


class InvertedResidualConfig:
    def __init__(self, input_channels, kernel, expanded_channels, out_channels, use_se,
                 activation, stride, dilation, width_mult):
        self.input_channels = self.adjust_channels(input_channels, width_mult)
        self.kernel = kernel
        self.expanded_channels = self.adjust_channels(expanded_channels, width_mult)
        self.out_channels = self.adjust_channels(out_channels, width_mult)
        self.use_se = use_se
        self.use_hs = activation == "HS"
        self.stride = stride
        self.dilation = dilation

    @staticmethod
    def adjust_channels(channels, width_mult):
        return _make_divisible(channels * width_mult, 8)


class InvertedResidual(nn.Module):
    def __init__(self, cnf, norm_layer,
                 se_layer=partial(SqueezeExcitation, scale_activation=nn.Hardsigmoid)):
        super().__init__()
        if not (1 <= cnf.stride <= 2):
            raise ValueError("illegal stride value")
        self.use_res_connect = cnf.stride == 1 and cnf.input_channels == cnf.out_channels
        layers = []
        activation_layer = nn.Hardswish if cnf.use_hs else nn.ReLU
        if cnf.expanded_channels != cnf.input_channels:
            layers.append(Conv2dNormActivation(cnf.input_channels, cnf.expanded_channels,
                                               kernel_size=1, norm_layer=norm_layer,
                                               activation_layer=activation_layer))
        stride = 1 if cnf.dilation > 1 else cnf.stride
        layers.append(Conv2dNormActivation(cnf.expanded_channels, cnf.expanded_channels,
                                           kernel_size=cnf.kernel, stride=stride,
                                           dilation=cnf.dilation, groups=cnf.expanded_channels,
                                           norm_layer=norm_layer,
                                           activation_layer=activation_layer))
        if cnf.use_se:
            squeeze_channels = _make_divisible(cnf.expanded_channels // 4, 8)
            layers.append(se_layer(cnf.expanded_channels, squeeze_channels))
        layers.append(Conv2dNormActivation(cnf.expanded_channels, cnf.out_channels,
                                           kernel_size=1, norm_layer=norm_layer,
                                           activation_layer=None))
        self.block = nn.Sequential(*layers)
        self.out_channels = cnf.out_channels
        self._is_cn = cnf.stride > 1

    def forward(self, input):
        result = self.block(input)
        if self.use_res_connect:
            result += input
        return result


def mobilenet_v3_blocks() -> nn.Sequential:
    """Three of MobileNetV3's blocks, built as MobileNetV3 builds them (its BatchNorm, its
    config rows): mobilenet_v3_small's first (SE, ReLU, stride 2, no expansion), a
    Hardswish one with SE and the residual, and a dilated one (``dilated=True``: stride 1,
    dilation 2)."""
    norm_layer = partial(nn.BatchNorm2d, eps=0.001, momentum=0.01)
    bneck_conf = partial(InvertedResidualConfig, width_mult=1.0)
    return nn.Sequential(*[InvertedResidual(cnf, norm_layer) for cnf in (
        bneck_conf(16, 3, 16, 16, True, "RE", 2, 1),
        bneck_conf(16, 5, 64, 16, True, "HS", 1, 1),
        bneck_conf(16, 3, 48, 24, True, "HS", 2, 2))])


# ----------------------------------------------------------------------------- RegNet
# pytorch/vision torchvision/models/regnet.py (BottleneckTransform, ResBottleneckBlock,
# AnyStage): a RegNetY stage, grouped 3x3 convolutions (group_width 8), SE, a projected
# shortcut in its first block; Conv2dNormActivation / SqueezeExcitation as above


class BottleneckTransform(nn.Sequential):
    def __init__(self, width_in, width_out, stride, norm_layer, activation_layer, group_width,
                 bottleneck_multiplier, se_ratio):
        layers = OrderedDict()
        w_b = int(round(width_out * bottleneck_multiplier))
        g = w_b // group_width
        layers["a"] = Conv2dNormActivation(width_in, w_b, kernel_size=1, stride=1,
                                           norm_layer=norm_layer,
                                           activation_layer=activation_layer)
        layers["b"] = Conv2dNormActivation(w_b, w_b, kernel_size=3, stride=stride, groups=g,
                                           norm_layer=norm_layer,
                                           activation_layer=activation_layer)
        if se_ratio:
            width_se_out = int(round(se_ratio * width_in))
            layers["se"] = SqueezeExcitation(input_channels=w_b, squeeze_channels=width_se_out,
                                             activation=activation_layer)
        layers["c"] = Conv2dNormActivation(w_b, width_out, kernel_size=1, stride=1,
                                           norm_layer=norm_layer, activation_layer=None)
        super().__init__(layers)


class ResBottleneckBlock(nn.Module):
    def __init__(self, width_in, width_out, stride, norm_layer, activation_layer,
                 group_width=1, bottleneck_multiplier=1.0, se_ratio=None):
        super().__init__()
        self.proj = None
        should_proj = (width_in != width_out) or (stride != 1)
        if should_proj:
            self.proj = Conv2dNormActivation(width_in, width_out, kernel_size=1, stride=stride,
                                             norm_layer=norm_layer, activation_layer=None)
        self.f = BottleneckTransform(width_in, width_out, stride, norm_layer, activation_layer,
                                     group_width, bottleneck_multiplier, se_ratio)
        self.activation = activation_layer(inplace=True)

    def forward(self, x):
        if self.proj is not None:
            x = self.proj(x) + self.f(x)
        else:
            x = x + self.f(x)
        return self.activation(x)


class AnyStage(nn.Sequential):
    def __init__(self, width_in, width_out, stride, depth, block_constructor, norm_layer,
                 activation_layer, group_width, bottleneck_multiplier, se_ratio=None,
                 stage_index=0):
        super().__init__()
        for i in range(depth):
            block = block_constructor(width_in if i == 0 else width_out, width_out,
                                      stride if i == 0 else 1, norm_layer, activation_layer,
                                      group_width, bottleneck_multiplier, se_ratio)
            self.add_module(f"block{stage_index}-{i}", block)


def regnet_y_stage() -> AnyStage:
    return AnyStage(16, 32, 2, 2, ResBottleneckBlock, nn.BatchNorm2d, nn.ReLU, group_width=8,
                    bottleneck_multiplier=1.0, se_ratio=0.25, stage_index=1)


# ----------------------------------------------------------------------------- DenseNet
# pytorch/vision torchvision/models/densenet.py (_DenseLayer, _DenseBlock, _Transition):
# pre-activation BN-ReLU-conv on the concatenation of every earlier layer's features;
# memory_efficient=True checkpoints the bottleneck (torch.utils.checkpoint, non-reentrant).
# Left out: _DenseLayer's two @torch.jit._overload_method stubs of forward (TorchScript's)


class _DenseLayer(nn.Module):
    def __init__(self, num_input_features, growth_rate, bn_size, drop_rate,
                 memory_efficient=False):
        super().__init__()
        self.norm1 = nn.BatchNorm2d(num_input_features)
        self.relu1 = nn.ReLU(inplace=True)
        self.conv1 = nn.Conv2d(num_input_features, bn_size * growth_rate, kernel_size=1,
                               stride=1, bias=False)
        self.norm2 = nn.BatchNorm2d(bn_size * growth_rate)
        self.relu2 = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(bn_size * growth_rate, growth_rate, kernel_size=3, stride=1,
                               padding=1, bias=False)
        self.drop_rate = float(drop_rate)
        self.memory_efficient = memory_efficient

    def bn_function(self, inputs):
        concated_features = torch.cat(inputs, 1)
        bottleneck_output = self.conv1(self.relu1(self.norm1(concated_features)))
        return bottleneck_output

    def any_requires_grad(self, input):
        for tensor in input:  # noqa: SIM110
            if tensor.requires_grad:
                return True
        return False

    @torch.jit.unused
    def call_checkpoint_bottleneck(self, input):
        def closure(*inputs):
            return self.bn_function(inputs)

        return cp.checkpoint(closure, *input, use_reentrant=False)

    def forward(self, input):
        if isinstance(input, torch.Tensor):
            prev_features = [input]
        else:
            prev_features = input
        if self.memory_efficient and self.any_requires_grad(prev_features):
            if torch.jit.is_scripting():
                raise Exception("Memory Efficient not supported in JIT")
            bottleneck_output = self.call_checkpoint_bottleneck(prev_features)
        else:
            bottleneck_output = self.bn_function(prev_features)
        new_features = self.conv2(self.relu2(self.norm2(bottleneck_output)))
        if self.drop_rate > 0:
            new_features = F.dropout(new_features, p=self.drop_rate, training=self.training)
        return new_features


class _DenseBlock(nn.ModuleDict):
    _version = 2

    def __init__(self, num_layers, num_input_features, bn_size, growth_rate, drop_rate,
                 memory_efficient=False):
        super().__init__()
        for i in range(num_layers):
            layer = _DenseLayer(num_input_features + i * growth_rate, growth_rate=growth_rate,
                                bn_size=bn_size, drop_rate=drop_rate,
                                memory_efficient=memory_efficient)
            self.add_module("denselayer%d" % (i + 1), layer)  # noqa: UP031

    def forward(self, init_features):
        features = [init_features]
        for name, layer in self.items():  # noqa: B007
            new_features = layer(features)
            features.append(new_features)
        return torch.cat(features, 1)


class _Transition(nn.Sequential):
    def __init__(self, num_input_features, num_output_features):
        super().__init__()
        self.norm = nn.BatchNorm2d(num_input_features)
        self.relu = nn.ReLU(inplace=True)
        self.conv = nn.Conv2d(num_input_features, num_output_features, kernel_size=1,
                              stride=1, bias=False)
        self.pool = nn.AvgPool2d(kernel_size=2, stride=2)


def densenet_stage(memory_efficient: bool = False) -> nn.Sequential:
    """DenseNet's features after the stem: a dense block of two layers and a transition,
    named and sized as DenseNet builds them (growth 8, bn_size 2, dropout 0.1)."""
    return nn.Sequential(OrderedDict([
        ("denseblock1", _DenseBlock(2, 16, bn_size=2, growth_rate=8, drop_rate=0.1,
                                    memory_efficient=memory_efficient)),
        ("transition1", _Transition(32, 16))]))


# ----------------------------------------------------------------------------- SegFormer
# huggingface/transformers src/transformers/models/segformer/modeling_segformer.py
# (drop_path, SegformerDropPath, SegformerOverlapPatchEmbeddings,
# SegformerEfficientSelfAttention, SegformerSelfOutput, SegformerAttention, SegformerDWConv,
# SegformerMixFFN, SegformerLayer, SegformerEncoder; return_dict=False); ACT2FN["gelu"] is
# GELUActivation (above). Left out: the heads-divide-hidden-size check, prune_heads


def seg_drop_path(input, drop_prob=0.0, training=False):
    if drop_prob == 0.0 or not training:
        return input
    keep_prob = 1 - drop_prob
    shape = (input.shape[0],) + (1,) * (input.ndim - 1)
    random_tensor = keep_prob + torch.rand(shape, dtype=input.dtype, device=input.device)
    random_tensor.floor_()
    output = input.div(keep_prob) * random_tensor
    return output


class SegformerDropPath(nn.Module):
    def __init__(self, drop_prob=None):
        super().__init__()
        self.drop_prob = drop_prob

    def forward(self, hidden_states):
        return seg_drop_path(hidden_states, self.drop_prob, self.training)


class SegformerOverlapPatchEmbeddings(nn.Module):
    def __init__(self, patch_size, stride, num_channels, hidden_size):
        super().__init__()
        self.proj = nn.Conv2d(num_channels, hidden_size, kernel_size=patch_size, stride=stride,
                              padding=patch_size // 2)
        self.layer_norm = nn.LayerNorm(hidden_size)

    def forward(self, pixel_values):
        embeddings = self.proj(pixel_values)
        _, _, height, width = embeddings.shape
        embeddings = embeddings.flatten(2).transpose(1, 2)
        embeddings = self.layer_norm(embeddings)
        return embeddings, height, width


class SegformerEfficientSelfAttention(nn.Module):
    def __init__(self, config, hidden_size, num_attention_heads, sequence_reduction_ratio):
        super().__init__()
        self.hidden_size = hidden_size
        self.num_attention_heads = num_attention_heads
        self.attention_head_size = int(self.hidden_size / self.num_attention_heads)
        self.all_head_size = self.num_attention_heads * self.attention_head_size
        self.query = nn.Linear(self.hidden_size, self.all_head_size)
        self.key = nn.Linear(self.hidden_size, self.all_head_size)
        self.value = nn.Linear(self.hidden_size, self.all_head_size)
        self.dropout = nn.Dropout(config.attention_probs_dropout_prob)
        self.sr_ratio = sequence_reduction_ratio
        if sequence_reduction_ratio > 1:
            self.sr = nn.Conv2d(hidden_size, hidden_size, kernel_size=sequence_reduction_ratio,
                                stride=sequence_reduction_ratio)
            self.layer_norm = nn.LayerNorm(hidden_size)

    def transpose_for_scores(self, hidden_states):
        new_shape = hidden_states.size()[:-1] + (self.num_attention_heads,
                                                 self.attention_head_size)
        hidden_states = hidden_states.view(new_shape)
        return hidden_states.permute(0, 2, 1, 3)

    def forward(self, hidden_states, height, width, output_attentions=False):
        query_layer = self.transpose_for_scores(self.query(hidden_states))
        if self.sr_ratio > 1:
            batch_size, seq_len, num_channels = hidden_states.shape
            hidden_states = hidden_states.permute(0, 2, 1).reshape(batch_size, num_channels,
                                                                   height, width)
            hidden_states = self.sr(hidden_states)
            hidden_states = hidden_states.reshape(batch_size, num_channels, -1).permute(0, 2, 1)
            hidden_states = self.layer_norm(hidden_states)
        key_layer = self.transpose_for_scores(self.key(hidden_states))
        value_layer = self.transpose_for_scores(self.value(hidden_states))
        attention_scores = torch.matmul(query_layer, key_layer.transpose(-1, -2))
        attention_scores = attention_scores / math.sqrt(self.attention_head_size)
        attention_probs = nn.functional.softmax(attention_scores, dim=-1)
        attention_probs = self.dropout(attention_probs)
        context_layer = torch.matmul(attention_probs, value_layer)
        context_layer = context_layer.permute(0, 2, 1, 3).contiguous()
        new_context_layer_shape = context_layer.size()[:-2] + (self.all_head_size,)
        context_layer = context_layer.view(new_context_layer_shape)
        outputs = (context_layer, attention_probs) if output_attentions else (context_layer,)
        return outputs


class SegformerSelfOutput(nn.Module):
    def __init__(self, config, hidden_size):
        super().__init__()
        self.dense = nn.Linear(hidden_size, hidden_size)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)

    def forward(self, hidden_states, input_tensor):
        hidden_states = self.dense(hidden_states)
        hidden_states = self.dropout(hidden_states)
        return hidden_states


class SegformerAttention(nn.Module):
    def __init__(self, config, hidden_size, num_attention_heads, sequence_reduction_ratio):
        super().__init__()
        self.self = SegformerEfficientSelfAttention(
            config=config, hidden_size=hidden_size, num_attention_heads=num_attention_heads,
            sequence_reduction_ratio=sequence_reduction_ratio)
        self.output = SegformerSelfOutput(config, hidden_size=hidden_size)
        self.pruned_heads = set()

    def forward(self, hidden_states, height, width, output_attentions=False):
        self_outputs = self.self(hidden_states, height, width, output_attentions)
        attention_output = self.output(self_outputs[0], hidden_states)
        outputs = (attention_output,) + self_outputs[1:]
        return outputs


class SegformerDWConv(nn.Module):
    def __init__(self, dim=768):
        super().__init__()
        self.dwconv = nn.Conv2d(dim, dim, 3, 1, 1, bias=True, groups=dim)

    def forward(self, hidden_states, height, width):
        batch_size, seq_len, num_channels = hidden_states.shape
        hidden_states = hidden_states.transpose(1, 2).view(batch_size, num_channels, height,
                                                           width)
        hidden_states = self.dwconv(hidden_states)
        hidden_states = hidden_states.flatten(2).transpose(1, 2)
        return hidden_states


class SegformerMixFFN(nn.Module):
    def __init__(self, config, in_features, hidden_features=None, out_features=None):
        super().__init__()
        out_features = out_features or in_features
        self.dense1 = nn.Linear(in_features, hidden_features)
        self.dwconv = SegformerDWConv(hidden_features)
        self.intermediate_act_fn = GELUActivation()  # ACT2FN[config.hidden_act], "gelu"
        self.dense2 = nn.Linear(hidden_features, out_features)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)

    def forward(self, hidden_states, height, width):
        hidden_states = self.dense1(hidden_states)
        hidden_states = self.dwconv(hidden_states, height, width)
        hidden_states = self.intermediate_act_fn(hidden_states)
        hidden_states = self.dropout(hidden_states)
        hidden_states = self.dense2(hidden_states)
        hidden_states = self.dropout(hidden_states)
        return hidden_states


class SegformerLayer(nn.Module):
    def __init__(self, config, hidden_size, num_attention_heads, drop_path,
                 sequence_reduction_ratio, mlp_ratio):
        super().__init__()
        self.layer_norm_1 = nn.LayerNorm(hidden_size)
        self.attention = SegformerAttention(config, hidden_size=hidden_size,
                                            num_attention_heads=num_attention_heads,
                                            sequence_reduction_ratio=sequence_reduction_ratio)
        self.drop_path = SegformerDropPath(drop_path) if drop_path > 0.0 else nn.Identity()
        self.layer_norm_2 = nn.LayerNorm(hidden_size)
        mlp_hidden_size = int(hidden_size * mlp_ratio)
        self.mlp = SegformerMixFFN(config, in_features=hidden_size,
                                   hidden_features=mlp_hidden_size)

    def forward(self, hidden_states, height, width, output_attentions=False):
        self_attention_outputs = self.attention(self.layer_norm_1(hidden_states), height, width,
                                                output_attentions=output_attentions)
        attention_output = self_attention_outputs[0]
        outputs = self_attention_outputs[1:]
        attention_output = self.drop_path(attention_output)
        hidden_states = attention_output + hidden_states
        mlp_output = self.mlp(self.layer_norm_2(hidden_states), height, width)
        mlp_output = self.drop_path(mlp_output)
        layer_output = mlp_output + hidden_states
        outputs = (layer_output,) + outputs
        return outputs


class SegformerEncoder(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.config = config
        drop_path_decays = [x.item() for x in torch.linspace(0, config.drop_path_rate,
                                                             sum(config.depths))]
        embeddings = []
        for i in range(config.num_encoder_blocks):
            embeddings.append(SegformerOverlapPatchEmbeddings(
                patch_size=config.patch_sizes[i], stride=config.strides[i],
                num_channels=config.num_channels if i == 0 else config.hidden_sizes[i - 1],
                hidden_size=config.hidden_sizes[i]))
        self.patch_embeddings = nn.ModuleList(embeddings)
        blocks = []
        cur = 0
        for i in range(config.num_encoder_blocks):
            layers = []
            if i != 0:
                cur += config.depths[i - 1]
            for j in range(config.depths[i]):
                layers.append(SegformerLayer(
                    config, hidden_size=config.hidden_sizes[i],
                    num_attention_heads=config.num_attention_heads[i],
                    drop_path=drop_path_decays[cur + j],
                    sequence_reduction_ratio=config.sr_ratios[i],
                    mlp_ratio=config.mlp_ratios[i]))
            blocks.append(nn.ModuleList(layers))
        self.block = nn.ModuleList(blocks)
        self.layer_norm = nn.ModuleList([nn.LayerNorm(config.hidden_sizes[i])
                                         for i in range(config.num_encoder_blocks)])

    def forward(self, pixel_values, output_attentions=False, output_hidden_states=False,
                return_dict=False):
        all_hidden_states = () if output_hidden_states else None
        all_self_attentions = () if output_attentions else None
        batch_size = pixel_values.shape[0]
        hidden_states = pixel_values
        for idx, x in enumerate(zip(self.patch_embeddings, self.block, self.layer_norm)):
            embedding_layer, block_layer, norm_layer = x
            hidden_states, height, width = embedding_layer(hidden_states)
            for i, blk in enumerate(block_layer):  # noqa: B007
                layer_outputs = blk(hidden_states, height, width, output_attentions)
                hidden_states = layer_outputs[0]
                if output_attentions:
                    all_self_attentions = all_self_attentions + (layer_outputs[1],)
            hidden_states = norm_layer(hidden_states)
            if idx != len(self.patch_embeddings) - 1 or (
                    idx == len(self.patch_embeddings) - 1 and self.config.reshape_last_stage):
                hidden_states = hidden_states.reshape(batch_size, height, width, -1).permute(
                    0, 3, 1, 2).contiguous()
            if output_hidden_states:
                all_hidden_states = all_hidden_states + (hidden_states,)
        return tuple(v for v in [hidden_states, all_hidden_states, all_self_attentions]
                     if v is not None)


def segformer_encoder() -> SegformerEncoder:
    """Mix Transformer (nvidia/mit-b0's layout) with two stages of two layers each, tiny:
    overlapping patch embeddings (7x7 stride 4, then 3x3 stride 2), spatial reduction 2
    then 1, drop path rising to 0.1."""
    return SegformerEncoder(SimpleNamespace(
        num_encoder_blocks=2, depths=[2, 1], sr_ratios=[2, 1], hidden_sizes=[16, 32],
        patch_sizes=[7, 3], strides=[4, 2], num_attention_heads=[1, 2], mlp_ratios=[2, 2],
        num_channels=3, drop_path_rate=0.1, attention_probs_dropout_prob=0.1,
        hidden_dropout_prob=0.1, hidden_act="gelu", reshape_last_stage=True))


# ----------------------------------------------------------------------------- Wav2Vec2
# huggingface/transformers src/transformers/models/wav2vec2/modeling_wav2vec2.py
# (Wav2Vec2NoLayerNormConvLayer, Wav2Vec2GroupNormConvLayer, Wav2Vec2SamePadLayer,
# Wav2Vec2PositionalConvEmbedding: a grouped conv under torch's weight_norm
# parametrization, Wav2Vec2FeatureEncoder, Wav2Vec2FeatureProjection; Wav2Vec2Model's
# forward up to the transformer layers: no SpecAugment masking). Left out: DeepSpeed
# ZeRO-3's gathering of the conv weight, feat_extract_norm="layer"'s conv layers


class Wav2Vec2NoLayerNormConvLayer(nn.Module):
    def __init__(self, config, layer_id=0):
        super().__init__()
        self.in_conv_dim = config.conv_dim[layer_id - 1] if layer_id > 0 else 1
        self.out_conv_dim = config.conv_dim[layer_id]
        self.conv = nn.Conv1d(self.in_conv_dim, self.out_conv_dim,
                              kernel_size=config.conv_kernel[layer_id],
                              stride=config.conv_stride[layer_id], bias=config.conv_bias)
        self.activation = GELUActivation()  # ACT2FN[config.feat_extract_activation]

    def forward(self, hidden_states):
        hidden_states = self.conv(hidden_states)
        hidden_states = self.activation(hidden_states)
        return hidden_states


class Wav2Vec2GroupNormConvLayer(nn.Module):
    def __init__(self, config, layer_id=0):
        super().__init__()
        self.in_conv_dim = config.conv_dim[layer_id - 1] if layer_id > 0 else 1
        self.out_conv_dim = config.conv_dim[layer_id]
        self.conv = nn.Conv1d(self.in_conv_dim, self.out_conv_dim,
                              kernel_size=config.conv_kernel[layer_id],
                              stride=config.conv_stride[layer_id], bias=config.conv_bias)
        self.activation = GELUActivation()  # ACT2FN[config.feat_extract_activation]
        self.layer_norm = nn.GroupNorm(num_groups=self.out_conv_dim,
                                       num_channels=self.out_conv_dim, affine=True)

    def forward(self, hidden_states):
        hidden_states = self.conv(hidden_states)
        hidden_states = self.layer_norm(hidden_states)
        hidden_states = self.activation(hidden_states)
        return hidden_states


class Wav2Vec2SamePadLayer(nn.Module):
    def __init__(self, num_conv_pos_embeddings):
        super().__init__()
        self.num_pad_remove = 1 if num_conv_pos_embeddings % 2 == 0 else 0

    def forward(self, hidden_states):
        if self.num_pad_remove > 0:
            hidden_states = hidden_states[:, :, : -self.num_pad_remove]
        return hidden_states


class Wav2Vec2PositionalConvEmbedding(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.conv = nn.Conv1d(config.hidden_size, config.hidden_size,
                              kernel_size=config.num_conv_pos_embeddings,
                              padding=config.num_conv_pos_embeddings // 2,
                              groups=config.num_conv_pos_embedding_groups)
        weight_norm = nn.utils.weight_norm
        if hasattr(nn.utils.parametrizations, "weight_norm"):
            weight_norm = nn.utils.parametrizations.weight_norm
        self.conv = weight_norm(self.conv, name="weight", dim=2)
        self.padding = Wav2Vec2SamePadLayer(config.num_conv_pos_embeddings)
        self.activation = GELUActivation()  # ACT2FN[config.feat_extract_activation]

    def forward(self, hidden_states):
        hidden_states = hidden_states.transpose(1, 2)
        hidden_states = self.conv(hidden_states)
        hidden_states = self.padding(hidden_states)
        hidden_states = self.activation(hidden_states)
        hidden_states = hidden_states.transpose(1, 2)
        return hidden_states


class Wav2Vec2FeatureEncoder(nn.Module):
    def __init__(self, config):
        super().__init__()
        conv_layers = [Wav2Vec2GroupNormConvLayer(config, layer_id=0)] + [
            Wav2Vec2NoLayerNormConvLayer(config, layer_id=i + 1)
            for i in range(config.num_feat_extract_layers - 1)]
        self.conv_layers = nn.ModuleList(conv_layers)
        self.gradient_checkpointing = False
        self._requires_grad = True

    def _freeze_parameters(self):
        for param in self.parameters():
            param.requires_grad = False
        self._requires_grad = False

    def forward(self, input_values):
        hidden_states = input_values[:, None]
        if self._requires_grad and self.training:
            hidden_states.requires_grad = True
        for conv_layer in self.conv_layers:
            if self._requires_grad and self.gradient_checkpointing and self.training:
                hidden_states = self._gradient_checkpointing_func(conv_layer.__call__,
                                                                  hidden_states)
            else:
                hidden_states = conv_layer(hidden_states)
        return hidden_states


class Wav2Vec2FeatureProjection(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.layer_norm = nn.LayerNorm(config.conv_dim[-1], eps=config.layer_norm_eps)
        self.projection = nn.Linear(config.conv_dim[-1], config.hidden_size)
        self.dropout = nn.Dropout(config.feat_proj_dropout)

    def forward(self, hidden_states):
        norm_hidden_states = self.layer_norm(hidden_states)
        hidden_states = self.projection(norm_hidden_states)
        hidden_states = self.dropout(hidden_states)
        return hidden_states, norm_hidden_states


class Wav2Vec2Front(nn.Module):
    """Wav2Vec2Model's forward (feature encoder, transpose, projection) and then
    Wav2Vec2Encoder's (positional conv embedding added, LayerNorm, dropout) up to its
    layers, with the feature encoder frozen as fine-tuning does (``freeze_feature_encoder``:
    its forward sets ``requires_grad`` on its input's view otherwise, which torch refuses
    for an input that requires grad)."""

    def __init__(self, config=None):
        super().__init__()
        config = config or SimpleNamespace(
            conv_dim=(8, 8), conv_kernel=(5, 3), conv_stride=(3, 2), conv_bias=False,
            feat_extract_activation="gelu", feat_extract_norm="group",
            num_feat_extract_layers=2, hidden_size=16, layer_norm_eps=1e-5,
            feat_proj_dropout=0.1, num_conv_pos_embeddings=4, num_conv_pos_embedding_groups=4,
            hidden_dropout=0.1)
        self.feature_extractor = Wav2Vec2FeatureEncoder(config)
        self.feature_extractor._freeze_parameters()
        self.feature_projection = Wav2Vec2FeatureProjection(config)
        self.pos_conv_embed = Wav2Vec2PositionalConvEmbedding(config)
        self.layer_norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.dropout = nn.Dropout(config.hidden_dropout)

    def forward(self, input_values):
        extract_features = self.feature_extractor(input_values)
        extract_features = extract_features.transpose(1, 2)
        hidden_states, extract_features = self.feature_projection(extract_features)
        position_embeddings = self.pos_conv_embed(hidden_states)
        hidden_states = hidden_states + position_embeddings
        hidden_states = self.layer_norm(hidden_states)
        hidden_states = self.dropout(hidden_states)
        return hidden_states, extract_features


# ----------------------------------------------------------------------------- ConvNeXt V2
# facebookresearch/ConvNeXt-V2 models/convnextv2.py (Block, ConvNeXtV2), models/utils.py
# (LayerNorm: channels_last through F.layer_norm, channels_first written out; GRN); DropPath
# from timm (above)


class ConvNeXtV2LayerNorm(nn.Module):
    def __init__(self, normalized_shape, eps=1e-6, data_format="channels_last"):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(normalized_shape))
        self.bias = nn.Parameter(torch.zeros(normalized_shape))
        self.eps = eps
        self.data_format = data_format
        if self.data_format not in ["channels_last", "channels_first"]:
            raise NotImplementedError
        self.normalized_shape = (normalized_shape, )

    def forward(self, x):
        if self.data_format == "channels_last":
            return F.layer_norm(x, self.normalized_shape, self.weight, self.bias, self.eps)
        elif self.data_format == "channels_first":
            u = x.mean(1, keepdim=True)
            s = (x - u).pow(2).mean(1, keepdim=True)
            x = (x - u) / torch.sqrt(s + self.eps)
            x = self.weight[:, None, None] * x + self.bias[:, None, None]
            return x


class GRN(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.gamma = nn.Parameter(torch.zeros(1, 1, 1, dim))
        self.beta = nn.Parameter(torch.zeros(1, 1, 1, dim))

    def forward(self, x):
        Gx = torch.norm(x, p=2, dim=(1, 2), keepdim=True)
        Nx = Gx / (Gx.mean(dim=-1, keepdim=True) + 1e-6)
        return self.gamma * (x * Nx) + self.beta + x


class ConvNeXtV2Block(nn.Module):
    def __init__(self, dim, drop_path=0.):
        super().__init__()
        self.dwconv = nn.Conv2d(dim, dim, kernel_size=7, padding=3, groups=dim)
        self.norm = ConvNeXtV2LayerNorm(dim, eps=1e-6)
        self.pwconv1 = nn.Linear(dim, 4 * dim)
        self.act = nn.GELU()
        self.grn = GRN(4 * dim)
        self.pwconv2 = nn.Linear(4 * dim, dim)
        self.drop_path = DropPath(drop_path) if drop_path > 0. else nn.Identity()

    def forward(self, x):
        input = x
        x = self.dwconv(x)
        x = x.permute(0, 2, 3, 1)
        x = self.norm(x)
        x = self.pwconv1(x)
        x = self.act(x)
        x = self.grn(x)
        x = self.pwconv2(x)
        x = x.permute(0, 3, 1, 2)
        x = input + self.drop_path(x)
        return x


class ConvNeXtV2(nn.Module):
    def __init__(self, in_chans=3, num_classes=10, depths=(1, 1, 2, 1), dims=(8, 8, 16, 16),
                 drop_path_rate=0.1, head_init_scale=1.):
        super().__init__()
        self.depths = depths
        self.downsample_layers = nn.ModuleList()
        stem = nn.Sequential(
            nn.Conv2d(in_chans, dims[0], kernel_size=4, stride=4),
            ConvNeXtV2LayerNorm(dims[0], eps=1e-6, data_format="channels_first"))
        self.downsample_layers.append(stem)
        for i in range(3):
            downsample_layer = nn.Sequential(
                ConvNeXtV2LayerNorm(dims[i], eps=1e-6, data_format="channels_first"),
                nn.Conv2d(dims[i], dims[i + 1], kernel_size=2, stride=2))
            self.downsample_layers.append(downsample_layer)
        self.stages = nn.ModuleList()
        dp_rates = [x.item() for x in torch.linspace(0, drop_path_rate, sum(depths))]
        cur = 0
        for i in range(4):
            stage = nn.Sequential(*[ConvNeXtV2Block(dim=dims[i], drop_path=dp_rates[cur + j])
                                    for j in range(depths[i])])
            self.stages.append(stage)
            cur += depths[i]
        self.norm = nn.LayerNorm(dims[-1], eps=1e-6)
        self.head = nn.Linear(dims[-1], num_classes)
        # (the published init, trunc_normal_(std=.02) and zero biases, is left out: with
        # it, and GRN's zero gamma / beta, the blocks barely change their input; the case
        # below gives GRN random parameters, as a trained model has)
        self.head.weight.data.mul_(head_init_scale)
        self.head.bias.data.mul_(head_init_scale)

    def forward_features(self, x):
        for i in range(4):
            x = self.downsample_layers[i](x)
            x = self.stages[i](x)
        return self.norm(x.mean([-2, -1]))

    def forward(self, x):
        x = self.forward_features(x)
        x = self.head(x)
        return x


def convnextv2() -> ConvNeXtV2:
    model = ConvNeXtV2()
    g = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, GRN):
                m.gamma.copy_(torch.randn(m.gamma.shape, generator=g))
                m.beta.copy_(0.5 * torch.randn(m.beta.shape, generator=g))
    return model


# ----------------------------------------------------------------------------- timm ViT
# huggingface/pytorch-image-models timm/models/vision_transformer.py (Block: DeiT, DeiT-III,
# MAE and the other ViTs timm builds), timm/layers/attention.py (Attention, fused: F.scaled_
# dot_product_attention), timm/layers/layer_scale.py (LayerScale), timm/layers/mlp.py (Mlp),
# timm/layers/norm.py (LayerNorm, fast norm off as by default); DropPath above


class TimmLayerNorm(nn.LayerNorm):
    def __init__(self, num_channels, eps=1e-6, affine=True, **kwargs):
        super().__init__(num_channels, eps=eps, elementwise_affine=affine, **kwargs)
        self._fast_norm = False  # is_fast_norm(): off unless set_fast_norm()

    def forward(self, x):
        if self._fast_norm:
            raise NotImplementedError  # (apex's fast_layer_norm)
        else:
            x = F.layer_norm(x, self.normalized_shape, self.weight, self.bias, self.eps)
        return x


class TimmLayerScale(nn.Module):
    def __init__(self, dim, init_values=1e-5, inplace=False):
        super().__init__()
        self.init_values = init_values
        self.inplace = inplace
        self.gamma = nn.Parameter(torch.empty(dim))
        self.reset_parameters()

    def reset_parameters(self):
        torch.nn.init.constant_(self.gamma, self.init_values)

    def forward(self, x):
        return x.mul_(self.gamma) if self.inplace else x * self.gamma


class TimmMlp(nn.Module):
    def __init__(self, in_features, hidden_features=None, out_features=None, act_layer=nn.GELU,
                 norm_layer=None, bias=True, drop=0., use_conv=False):
        super().__init__()
        out_features = out_features or in_features
        hidden_features = hidden_features or in_features
        bias = (bias, bias)
        drop_probs = (drop, drop)
        linear_layer = partial(nn.Conv2d, kernel_size=1) if use_conv else nn.Linear
        self.fc1 = linear_layer(in_features, hidden_features, bias=bias[0])
        self.act = act_layer()
        self.drop1 = nn.Dropout(drop_probs[0])
        self.norm = norm_layer(hidden_features) if norm_layer is not None else nn.Identity()
        self.fc2 = linear_layer(hidden_features, out_features, bias=bias[1])
        self.drop2 = nn.Dropout(drop_probs[1])

    def forward(self, x):
        x = self.fc1(x)
        x = self.act(x)
        x = self.drop1(x)
        x = self.norm(x)
        x = self.fc2(x)
        x = self.drop2(x)
        return x


class TimmAttention(nn.Module):
    def __init__(self, dim, num_heads=8, attn_head_dim=None, dim_out=None, qkv_bias=False,
                 qk_norm=False, scale_norm=False, proj_bias=True, attn_drop=0., proj_drop=0.,
                 norm_layer=None):
        super().__init__()
        dim_out = dim_out or dim
        head_dim = attn_head_dim
        if head_dim is None:
            assert dim % num_heads == 0, "dim should be divisible by num_heads"
            head_dim = dim // num_heads
        self.num_heads = num_heads
        self.head_dim = head_dim
        self.attn_dim = num_heads * head_dim
        self.scale = head_dim ** -0.5
        self.fused_attn = True  # use_fused_attn()
        self.qkv = nn.Linear(dim, self.attn_dim * 3, bias=qkv_bias)
        self.q_norm = norm_layer(head_dim) if qk_norm else nn.Identity()
        self.k_norm = norm_layer(head_dim) if qk_norm else nn.Identity()
        self.attn_drop = nn.Dropout(attn_drop)
        self.norm = norm_layer(self.attn_dim) if scale_norm else nn.Identity()
        self.proj = nn.Linear(self.attn_dim, dim_out, bias=proj_bias)
        self.proj_drop = nn.Dropout(proj_drop)

    def forward(self, x, attn_mask=None, is_causal=False):
        B, N, C = x.shape
        qkv = self.qkv(x).reshape(B, N, 3, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4)
        q, k, v = qkv.unbind(0)
        q, k = self.q_norm(q), self.k_norm(k)
        if self.fused_attn:
            x = F.scaled_dot_product_attention(
                q, k, v, attn_mask=attn_mask,
                dropout_p=self.attn_drop.p if self.training else 0., is_causal=is_causal)
        else:
            raise NotImplementedError  # (the unfused path: q @ k^T, mask, softmax, @ v)
        x = x.transpose(1, 2).reshape(B, N, self.attn_dim)
        x = self.norm(x)
        x = self.proj(x)
        x = self.proj_drop(x)
        return x


class TimmBlock(nn.Module):
    def __init__(self, dim, num_heads, mlp_ratio=4., qkv_bias=False, qk_norm=False,
                 scale_attn_norm=False, scale_mlp_norm=False, proj_bias=True, proj_drop=0.,
                 attn_drop=0., init_values=None, drop_path=0., act_layer=nn.GELU,
                 norm_layer=TimmLayerNorm, mlp_layer=TimmMlp, attn_layer=TimmAttention):
        super().__init__()
        self.norm1 = norm_layer(dim)
        self.attn = attn_layer(dim, num_heads=num_heads, qkv_bias=qkv_bias, qk_norm=qk_norm,
                               scale_norm=scale_attn_norm, proj_bias=proj_bias,
                               attn_drop=attn_drop, proj_drop=proj_drop, norm_layer=norm_layer)
        self.ls1 = TimmLayerScale(dim, init_values=init_values) if init_values else nn.Identity()
        self.drop_path1 = DropPath(drop_path) if drop_path > 0. else nn.Identity()
        self.norm2 = norm_layer(dim)
        self.mlp = mlp_layer(in_features=dim, hidden_features=int(dim * mlp_ratio),
                             act_layer=act_layer,
                             norm_layer=norm_layer if scale_mlp_norm else None, bias=proj_bias,
                             drop=proj_drop)
        self.ls2 = TimmLayerScale(dim, init_values=init_values) if init_values else nn.Identity()
        self.drop_path2 = DropPath(drop_path) if drop_path > 0. else nn.Identity()

    def forward(self, x, attn_mask=None, is_causal=False):
        x = x + self.drop_path1(self.ls1(self.attn(self.norm1(x), attn_mask=attn_mask,
                                                   is_causal=is_causal)))
        x = x + self.drop_path2(self.ls2(self.mlp(self.norm2(x))))
        return x


def deit3_block() -> TimmBlock:
    """A DeiT-III block (qkv bias, LayerScale), tiny, with attention dropout and drop path:
    8 heads of 8, the head size dnnctl's attention takes."""
    return TimmBlock(64, 8, mlp_ratio=2., qkv_bias=True, init_values=0.5, attn_drop=0.1,
                     drop_path=0.1)


# ============================================================================= the zoo


def _g(seed: int = 5) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _randn(g: torch.Generator, dtype: torch.dtype, *shape: int) -> torch.Tensor:
    return torch.randn(*shape, generator=g).to(dtype)


def _gpt2_calls(dtype):
    g = _g()
    x, step = _randn(g, dtype, 2, 6, 32), _randn(g, dtype, 2, 1, 32)
    past = (_randn(g, dtype, 2, 4, 5, 8), _randn(g, dtype, 2, 4, 5, 8))
    pad = torch.ones(2, 6)
    pad[1, :2] = 0  # left padding, as GPT-2 batches prompts
    return [((x,), {}), ((x,), {"attention_mask": bert_mask(pad, dtype)}),
            ((x,), {"use_cache": True}), ((step,), {"layer_past": past, "use_cache": True})]


def _bert_calls(dtype):
    g = _g()
    x, pad = _randn(g, dtype, 2, 6, 32), torch.ones(2, 6)
    pad[1, 4:] = 0
    return [((x,), {}), ((x, bert_mask(pad, dtype)), {})]


def _t5_calls(dtype):
    g = _g()
    x, pad = _randn(g, dtype, 2, 6, 32), torch.ones(2, 6)
    pad[0, 5:] = 0
    return [((x,), {}), ((x,), {"attention_mask": bert_mask(pad, dtype)})]


def _clip_calls(dtype):
    g = _g()
    x, pad = _randn(g, dtype, 2, 6, 32), torch.ones(2, 6)
    pad[1, 3:] = 0
    causal = clip_causal_mask(2, 6, dtype)
    return [((x, bert_mask(pad, dtype), causal), {}), ((x, None, causal), {})]


def _convnext_calls(dtype):
    g = _g()
    x = _randn(g, dtype, 2, 16, 7, 7)
    return [((x,), {}), ((x.contiguous(memory_format=torch.channels_last),), {})]


def _sd_calls(dtype):
    g = _g()
    return [((_randn(g, dtype, 2, 32, 4, 4), _randn(g, dtype, 2, 32, 4, 4),
              _randn(g, dtype, 2, 16)), {})]


def _qwen_calls(dtype):
    g = _g()
    pos = torch.arange(6)[None].expand(2, 6)
    return [((_randn(g, dtype, 2, 6, 32), sliding_window_mask(2, 6, 4, dtype), pos), {})]


def _detr_calls(dtype):
    g = _g()
    tgt, memory = _randn(g, dtype, 5, 2, 32), _randn(g, dtype, 7, 2, 32)
    padding = torch.zeros(2, 7, dtype=torch.bool)
    padding[1, 5:] = True
    return [((tgt, memory), {}),
            ((tgt, memory), {"memory_key_padding_mask": padding,
                             "pos": _randn(g, dtype, 7, 2, 32),
                             "query_pos": _randn(g, dtype, 5, 2, 32)})]


def _one(*shape: int):
    return lambda dtype: [((_randn(_g(), dtype, *shape),), {})]


def _and_channels_last(*shape: int):
    """One image batch, as it is and in channels-last memory."""
    def calls(dtype):
        x = _randn(_g(), dtype, *shape)
        return [((x,), {}), ((x.contiguous(memory_format=torch.channels_last),), {})]
    return calls


def _segformer_calls(dtype):
    x = _randn(_g(), dtype, 2, 3, 16, 16)
    return [((x,), {}), ((x,), {"output_attentions": True, "output_hidden_states": True})]


def _timm_block_calls(dtype):
    x = _randn(_g(), dtype, 2, 5, 64)
    allowed = torch.ones(5, 5, dtype=torch.bool)
    allowed[:, 3:] = False  # (a padding mask: the last two tokens hidden)
    return [((x,), {}), ((x,), {"attn_mask": allowed}), ((x, None, True), {})]


@dataclass(frozen=True)
class Case:
    """One model of the zoo: how to make it and call it, and what patch should say of it
    (``traced``: fx traces it, else the reason's words; ``covered`` / ``skipped``: module
    names, the latter with words of the reason; ``fused``: head -> parts in eval;
    ``pickles``: torch.save of the whole model object works, as it does not for a model
    with a parametrized module, weight_norm's, patched or not)."""

    make: Callable[[], nn.Module]
    calls: Callable[[torch.dtype], list]
    traced: bool | str
    covered: frozenset[str]
    skipped: tuple[tuple[str, str], ...] = ()
    fused: tuple[tuple[str, tuple[str, ...]], ...] = ()
    dtypes: tuple[torch.dtype, ...] = (torch.float32, torch.float64)
    pickles: bool = True


def _cna(name: str, act: bool = True) -> tuple[str, ...]:
    """A torchvision Conv2dNormActivation's modules: conv, norm, [activation]."""
    return (f"{name}.0", f"{name}.1", *((f"{name}.2",) if act else ()))


def _se(name: str) -> tuple[str, ...]:
    """A torchvision SqueezeExcitation's modules."""
    return tuple(f"{name}.{m}" for m in ("avgpool", "fc1", "fc2", "activation",
                                          "scale_activation"))


_DENSENET = frozenset({
    *(f"denseblock1.denselayer{i}.{m}" for i in (1, 2)
      for m in ("norm1", "relu1", "conv1", "norm2", "relu2", "conv2")),
    *(f"transition1.{m}" for m in ("norm", "relu", "conv", "pool"))})

_CONTROL_FLOW = "control flow"  # fx's words for ``assert L == H * W`` on a traced value
_WHISPER_SUBCLASS = "a subclass of"

ZOO: dict[str, Case] = {
    "gpt2": Case(GPT2Block, _gpt2_calls, _CONTROL_FLOW, frozenset({
        "ln_1", "ln_2", "attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj"})),
    "bert": Case(BertLayer, _bert_calls, True, frozenset({
        "attention.self.query", "attention.self.key", "attention.self.value",
        "attention.output.dense", "attention.output.LayerNorm", "intermediate.dense",
        "output.dense", "output.LayerNorm"}), fused=(("intermediate.dense", ("gelu",)),)),
    "t5": Case(T5Block, _t5_calls, _CONTROL_FLOW, frozenset({
        "layer.0.SelfAttention.q", "layer.0.SelfAttention.k", "layer.0.SelfAttention.v",
        "layer.0.SelfAttention.o", "layer.1.DenseReluDense.wi_0",
        "layer.1.DenseReluDense.wi_1", "layer.1.DenseReluDense.wo"})),
    "clip": Case(CLIPEncoderLayer, _clip_calls, True, frozenset({
        "self_attn.k_proj", "self_attn.v_proj", "self_attn.q_proj", "self_attn.out_proj",
        "layer_norm1", "mlp.fc1", "mlp.fc2", "layer_norm2"})),
    "swin": Case(SwinTransformerBlock, _one(2, 64, 16), _CONTROL_FLOW, frozenset({
        "norm1", "attn.qkv", "attn.proj", "attn.softmax", "norm2", "mlp.fc1", "mlp.act",
        "mlp.fc2"})),
    "convnext": Case(CNBlock, _convnext_calls, True, frozenset({
        "block.0", "block.2", "block.3", "block.4", "block.5"}),
        fused=(("block.3", ("gelu",)),)),
    "efficientnet": Case(MBConv, _one(2, 8, 7, 7), True, frozenset({
        "block.0.0", "block.0.1", "block.0.2", "block.1.0", "block.1.1", "block.1.2",
        "block.2.avgpool", "block.2.fc1", "block.2.fc2", "block.2.activation",
        "block.2.scale_activation", "block.3.0", "block.3.1"}),
        fused=(("block.0.0", ("bn", "silu")), ("block.1.0", ("bn", "silu")),
               ("block.2.fc1", ("silu",)), ("block.3.0", ("bn",)))),
    "sd_unet": Case(SDUpBlock, _sd_calls, True, frozenset({
        "resnets.0.norm1", "resnets.0.conv1", "resnets.0.time_emb_proj", "resnets.0.norm2",
        "resnets.0.conv2", "resnets.0.nonlinearity", "resnets.0.conv_shortcut",
        "upsamplers.1"}),
        fused=(("resnets.0.conv1", ("residual",)), ("resnets.0.conv2", ("residual",)))),
    "whisper": Case(AudioEncoder, _one(2, 8, 12), _CONTROL_FLOW, frozenset({"blocks.0.mlp.1"}),
                    skipped=tuple((n, _WHISPER_SUBCLASS) for n in (
                        "conv1", "conv2", "blocks.0.attn.query", "blocks.0.attn.key",
                        "blocks.0.attn.value", "blocks.0.attn.out", "blocks.0.attn_ln",
                        "blocks.0.mlp.0", "blocks.0.mlp.2", "blocks.0.mlp_ln", "ln_post")),
                    dtypes=(torch.float32,)),  # (its LayerNorm computes in float32)
    "whisper_front": Case(WhisperFront, _one(2, 8, 12), True,
                          frozenset({"conv1", "conv2", "ln_post"}),
                          fused=(("conv1", ("gelu",)), ("conv2", ("gelu",)))),
    "qwen2": Case(Qwen2Tiny, _qwen_calls, "expand()", frozenset({
        "layers.0.self_attn.q_proj", "layers.0.self_attn.k_proj", "layers.0.self_attn.v_proj",
        "layers.0.self_attn.o_proj", "layers.0.mlp.gate_proj", "layers.0.mlp.up_proj",
        "layers.0.mlp.down_proj", "layers.0.mlp.act_fn"})),
    "dinov2": Case(DinoBlock, _one(2, 5, 32), True, frozenset({
        "norm1", "attn.qkv", "attn.proj", "norm2", "mlp.fc1", "mlp.act", "mlp.fc2"}),
        fused=(("mlp.fc1", ("gelu",)),)),
    "dinov2_inplace_ls": Case(partial(DinoBlock, inplace=True), _one(2, 5, 32), True,
                              frozenset({"norm1", "attn.qkv", "attn.proj", "norm2", "mlp.fc1",
                                         "mlp.act", "mlp.fc2"}),
                              fused=(("mlp.fc1", ("gelu",)),)),
    "yolo_sppf": Case(SPPF, _one(2, 16, 8, 8), True, frozenset({
        "cv1.conv", "cv1.bn", "cv1.act", "cv2.conv", "cv2.bn", "m"}),
        fused=(("cv1.conv", ("bn", "silu")), ("cv2.conv", ("bn", "silu")))),
    "detr_decoder": Case(DetrDecoderLayer, _detr_calls, True, frozenset({
        "self_attn", "multihead_attn", "linear1", "linear2", "norm1", "norm2", "norm3"}),
        fused=(("linear1", ("relu",)),)),
    "mobilenet_v3": Case(mobilenet_v3_blocks, _and_channels_last(2, 16, 8, 8), True, frozenset({
        *_cna("0.block.0"), *_se("0.block.1"), *_cna("0.block.2", act=False),  # no expansion
        *_cna("1.block.0"), *_cna("1.block.1"), *_se("1.block.2"), *_cna("1.block.3", act=False),
        *_cna("2.block.0"), *_cna("2.block.1"), *_se("2.block.2"),
        *_cna("2.block.3", act=False)}),
        fused=(("0.block.0.0", ("bn", "relu")), ("0.block.1.fc1", ("relu",)),
               ("0.block.2.0", ("bn",)), ("1.block.0.0", ("bn", "hardswish")),
               ("1.block.1.0", ("bn", "hardswish")), ("1.block.2.fc1", ("relu",)),
               ("1.block.3.0", ("bn", "residual")), ("2.block.0.0", ("bn", "hardswish")),
               ("2.block.1.0", ("bn", "hardswish")), ("2.block.2.fc1", ("relu",)),
               ("2.block.3.0", ("bn",)))),
    "regnet_y": Case(regnet_y_stage, _one(2, 16, 8, 8), True, frozenset({
        *_cna("block1-0.proj", act=False), *_cna("block1-0.f.a"), *_cna("block1-0.f.b"),
        *_se("block1-0.f.se"), *_cna("block1-0.f.c", act=False), "block1-0.activation",
        *_cna("block1-1.f.a"), *_cna("block1-1.f.b"), *_se("block1-1.f.se"),
        *_cna("block1-1.f.c", act=False), "block1-1.activation"}),
        # relu(proj(x) + f(x)): the projection's conv takes the add and the ReLU
        fused=(("block1-0.proj.0", ("bn", "residual", "relu")),
               ("block1-0.f.a.0", ("bn", "relu")), ("block1-0.f.b.0", ("bn", "relu")),
               ("block1-0.f.se.fc1", ("relu",)), ("block1-0.f.c.0", ("bn",)),
               ("block1-1.f.a.0", ("bn", "relu")), ("block1-1.f.b.0", ("bn", "relu")),
               ("block1-1.f.se.fc1", ("relu",)), ("block1-1.f.c.0", ("bn", "residual", "relu")))),
    "densenet": Case(densenet_stage, _one(2, 16, 8, 8), True, _DENSENET,
                     # pre-activation: each norm1 takes its ReLU, each conv1 folds norm2 + relu2
                     fused=(("denseblock1.denselayer1.norm1", ("relu",)),
                            ("denseblock1.denselayer1.conv1", ("bn", "relu")),
                            ("denseblock1.denselayer2.norm1", ("relu",)),
                            ("denseblock1.denselayer2.conv1", ("bn", "relu")),
                            ("transition1.norm", ("relu",)))),
    # memory_efficient: ``any(t.requires_grad ...)`` does not trace; checkpointed in training
    "densenet_checkpointed": Case(partial(densenet_stage, memory_efficient=True),
                                  _one(2, 16, 8, 8), _CONTROL_FLOW, _DENSENET),
    "segformer": Case(segformer_encoder, _segformer_calls, True, frozenset({
        *(f"patch_embeddings.{i}.{m}" for i in (0, 1) for m in ("proj", "layer_norm")),
        *(f"block.{b}.{m}" for b in ("0.0", "0.1", "1.0") for m in (
            "layer_norm_1", "attention.self.query", "attention.self.key",
            "attention.self.value", "attention.output.dense", "layer_norm_2", "mlp.dense1",
            "mlp.dwconv.dwconv", "mlp.dense2")),
        *(f"block.0.{i}.attention.self.{m}" for i in (0, 1) for m in ("sr", "layer_norm")),
        "layer_norm.0", "layer_norm.1"})),
    # (torch.save of the model object: "Serialization of parametrized modules is only
    # supported through state_dict()", the positional conv's weight_norm, patched or not)
    "wav2vec2": Case(Wav2Vec2Front, _one(2, 100), True, frozenset({
        "feature_extractor.conv_layers.0.conv", "feature_extractor.conv_layers.0.layer_norm",
        "feature_extractor.conv_layers.1.conv", "feature_projection.layer_norm",
        "feature_projection.projection", "pos_conv_embed.conv", "layer_norm"}),
        fused=(("feature_extractor.conv_layers.1.conv", ("gelu",)),), pickles=False),
    "convnext_v2": Case(convnextv2, _and_channels_last(2, 3, 32, 32), True, frozenset({
        "downsample_layers.0.0", "downsample_layers.1.1", "downsample_layers.2.1",
        "downsample_layers.3.1", "norm", "head",
        *(f"stages.{b}.{m}" for b in ("0.0", "1.0", "2.0", "2.1", "3.0")
          for m in ("dwconv", "pwconv1", "act", "pwconv2"))}),
        fused=tuple((f"stages.{b}.pwconv1", ("gelu",)) for b in ("0.0", "1.0", "2.0", "2.1",
                                                                   "3.0"))),
    "deit3": Case(deit3_block, _timm_block_calls, True, frozenset({
        "attn.qkv", "scaled_dot_product_attention", "attn.proj", "mlp.fc1", "mlp.act",
        "mlp.fc2"}),
        skipped=(("norm1", "a subclass of LayerNorm"), ("norm2", "a subclass of LayerNorm")),
        fused=(("mlp.fc1", ("gelu",)),)),
}

@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    """One intra-op thread while the zoo runs: its tensors are tiny, and on a loaded
    two-core machine (CI's, with several test workers) torch's threads only wait for each
    other (a conv took 40 ms instead of 0.1, the file a minute instead of 20 s)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


_TOL = {torch.float32: (1e-4, 1e-4), torch.float64: (1e-9, 1e-10)}
_GRAD_TOL = {torch.float32: (1e-3, 1e-4), torch.float64: (1e-9, 1e-10)}


def _make(name: str, mode: str, dtype: torch.dtype = torch.float32) -> nn.Module:
    torch.manual_seed(0)
    return randomize_norms(ZOO[name].make()).to(dtype).train(mode == "train")


def _tensors(out) -> list[torch.Tensor]:
    """The tensors of a model's output (a tensor, or nested tuples with None in them)."""
    if isinstance(out, torch.Tensor):
        return [out]
    if isinstance(out, (tuple, list)):
        return [t for o in out for t in _tensors(o)]
    return []


def _run(model: nn.Module, call, seed: int = 7, grad: bool = False):
    """The model's output tensors for one call, with the RNG seeded (Dropout, DropPath and
    stochastic depth draw the same masks) and, with ``grad``, its floating inputs made
    leaves that require grad: (outputs, those inputs)."""
    args, kwargs = call
    if grad:
        args = tuple(a.detach().clone().requires_grad_() if isinstance(a, torch.Tensor)
                     and a.is_floating_point() else a for a in args)
    torch.manual_seed(seed)
    with torch.set_grad_enabled(grad):
        return _tensors(model(*args, **kwargs)), [a for a in args if isinstance(
            a, torch.Tensor) and a.requires_grad]


def _close(got, want, tol, what: str) -> None:
    assert len(got) == len(want), what
    for i, (g, w) in enumerate(zip(got, want)):
        torch.testing.assert_close(g, w, rtol=tol[0], atol=tol[1], msg=f"{what} {i}")


def _attributes(model: nn.Module) -> dict[str, Any]:
    """Each module's instance attributes and hook counts (unpatch gives them back)."""
    return {n: (sorted(m.__dict__), len(m._forward_hooks), len(m._forward_pre_hooks),
                len(m._backward_hooks)) for n, m in model.named_modules()}


def _state(model: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in model.state_dict().items()}


def _same_state(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["fp32", "fp64"])
@pytest.mark.parametrize("mode", ["eval", "train"])
@pytest.mark.parametrize("name", list(ZOO))
def test_zoo_model_patched_equals_eager_and_unpatch_restores_it(name, mode, dtype):
    """Every call form of each model (masks, caches, channels-last, optional arguments)
    gives the unpatched model's outputs; in training also its input and parameter
    gradients (dnnctl's backward kernels wherever they take the problem) and running
    statistics (fresh random inputs, random norm statistics, Dropout masks drawn alike).
    unpatch gives the model back exactly: its attributes and hooks, state_dict, and
    bit-for-bit the outputs it gave before the patch."""
    case = ZOO[name]
    if dtype not in case.dtypes:
        pytest.skip(f"{name} runs in float32 only")
    ref = _make(name, mode, dtype)
    model = copy.deepcopy(ref)
    calls = case.calls(dtype)
    before = [_run(m, c)[0] for c in calls for m in (ref, model)][1::2]
    attributes = _attributes(model)
    paths = dict(dt.BACKWARD_PATHS)
    report = dt.patch(model, backward="dnnctl")
    assert report.training == (mode == "train")
    for i, call in enumerate(calls):
        if mode == "eval":
            _close(_run(model, call)[0], _run(ref, call)[0], _TOL[dtype], f"call {i}")
            continue
        (want, xa), (got, xb) = _run(ref, call, grad=True), _run(model, call, grad=True)
        _close(got, want, _TOL[dtype], f"call {i}")
        g = [torch.randn_like(w) for w in want]
        sum((w * gi).sum() for w, gi in zip(want, g)).backward()
        sum((o * gi).sum() for o, gi in zip(got, g)).backward()
        _close([x.grad for x in xb], [x.grad for x in xa], _GRAD_TOL[dtype], "input grad")
        for (n, pa), pb in zip(ref.named_parameters(), model.parameters()):
            assert (pa.grad is None) == (pb.grad is None), n
            if pa.grad is not None:
                _close([pb.grad], [pa.grad], _GRAD_TOL[dtype], n)
                pa.grad = pb.grad = None
    _close([b for _, b in model.named_buffers()], [b for _, b in ref.named_buffers()],
           _TOL[dtype], "buffers")
    if mode == "train" and dtype == torch.float32:
        assert any(n > paths.get(k, 0) for k, n in dt.BACKWARD_PATHS.items()
                   if k[2] == "dnnctl")
    # dnnctl runs float32; float64 calls run torch's ops, said as fallbacks of that dtype
    assert {reason for (op, reason) in report.fallbacks() if op != "multihead_attention"} <= (
        set() if dtype == torch.float32 else {"dtype not float32/float16/bfloat16"})
    state = _state(model)
    dt.unpatch(model)
    assert _attributes(model) == attributes
    _same_state(_state(model), state)
    for i, call in enumerate(calls):
        for a, b in zip(_run(model, call)[0], before[i]):
            assert torch.equal(a, b), f"call {i}"


def _train_step(model: nn.Module, call, seed: int, sgd: bool) -> list[torch.Tensor]:
    """One training-mode call of ``model``: with ``sgd`` a gradient and an SGD step on its
    parameters (in place, as an optimizer's), else under no_grad (BatchNorm
    recalibration, swa_utils.update_bn's pass: only the running statistics change); the
    call's outputs."""
    model.train()
    out, _ = _run(model, call, seed=seed, grad=sgd)
    if sgd:
        sum(o.square().mean() for o in out).backward()
        with torch.no_grad():
            for p in model.parameters():
                if p.grad is not None:
                    p.sub_(0.01 * p.grad)
                    p.grad = None
    model.eval()
    return [o.detach() for o in out]


@pytest.mark.parametrize("name", list(ZOO))
def test_zoo_model_validates_trains_and_validates_again(name):
    """A model patched for inference, then trained between validations (a training loop's
    evaluation): an SGD step, then a pass that only recalibrates the BatchNorm statistics.
    Each validation gives the unpatched model's output with the weights and running
    statistics the steps left (folded BatchNorms included), each training call its
    output."""
    call = ZOO[name].calls(torch.float32)[0]
    ref = _make(name, "eval")
    model = copy.deepcopy(ref)
    dt.patch(model)
    for step in range(3):
        _close(_run(model, call)[0], _run(ref, call)[0], _TOL[torch.float32], f"eval {step}")
        if step < 2:
            _close(_train_step(model, call, step, sgd=step == 0),
                   _train_step(ref, call, step, sgd=step == 0), _TOL[torch.float32],
                   f"train {step}")
    _close([b for _, b in model.named_buffers()], [b for _, b in ref.named_buffers()],
           _TOL[torch.float32], "buffers")
    dt.unpatch(model)


@pytest.mark.parametrize("name", list(ZOO))
def test_zoo_model_report_says_what_was_covered_fused_and_skipped(name):
    """The report names the modules dnnctl runs, the chains it fused (eval) and the ones it
    left to torch with why; a model fx cannot trace says so and runs module by module."""
    case = ZOO[name]
    model = _make(name, "eval")
    with dt.patched(model) as report:
        pass
    if case.traced is True:
        assert report.traced and not report.trace_error
    else:
        assert not report.traced and case.traced in report.trace_error
    assert {c.name for c in report.covered} == case.covered
    assert {s.name: s.reason for s in report.skipped}.keys() == {n for n, _ in case.skipped}
    for n, words in case.skipped:
        assert words in next(s.reason for s in report.skipped if s.name == n)
    assert {f.head: tuple(f.parts) for f in report.fusions} == dict(case.fused)
    assert not any("forward" in m.__dict__ for m in model.modules())


@pytest.mark.parametrize("name", list(ZOO))
def test_zoo_model_loads_weights_copies_and_pickles_while_patched(name):
    """After patch: load_state_dict reaches the patched model (folded convolutions
    included); a deep copy computes with its own weights; torch.save of the patched model
    loads as the model before the patch (or is refused as that model's is)."""
    call = ZOO[name].calls(torch.float32)[0]
    ref = _make(name, "eval")
    model = copy.deepcopy(ref)
    dt.patch(model)
    _run(model, call)
    g = _g(11)
    new = {k: v + 0.1 * torch.randn(v.shape, generator=g) if v.is_floating_point() else v
           for k, v in ref.state_dict().items()}
    ref.load_state_dict(new)
    model.load_state_dict(new)
    _close(_run(model, call)[0], _run(ref, call)[0], _TOL[torch.float32], "loaded")
    twin, ref_twin = copy.deepcopy(model), copy.deepcopy(ref)
    with torch.no_grad():
        for p in (*twin.parameters(), *ref_twin.parameters()):
            p.mul_(-0.5)
    assert dt.is_patched(twin)
    _close(_run(twin, call)[0], _run(ref_twin, call)[0], _TOL[torch.float32], "copy")
    _close(_run(model, call)[0], _run(ref, call)[0], _TOL[torch.float32], "original")
    if ZOO[name].pickles:
        buf = io.BytesIO()
        torch.save(model, buf)
        buf.seek(0)
        loaded = torch.load(buf, weights_only=False)
        assert not dt.is_patched(loaded)
        assert not [m for m in loaded.modules()
                    if type(m.__dict__.get("forward")).__module__.startswith("dnnctl")]
        for a, b in zip(_run(loaded, call)[0], _run(ref, call)[0]):
            assert torch.equal(a, b)
    else:  # torch refuses the model object, patched or not: the same refusal
        refusals = []
        for m in (ref, model):
            with pytest.raises(RuntimeError) as refused:
                torch.save(m, io.BytesIO())
            refusals.append(str(refused.value))
        assert refusals[0] == refusals[1]
    dt.unpatch(twin)
    dt.unpatch(model)


@pytest.mark.parametrize("name", list(ZOO))
def test_zoo_model_jit_traces_and_exports_with_the_dnnctl_ops(name):
    """torch.jit.trace and torch.export of the patched model (eval) record dnnctl's ops and
    give the model's output. (export only of the models fx traces, whose graph holds the
    fused ops: ~0.5 s each; jit.trace takes tensors only, so no call with a None.)"""
    case, calls = ZOO[name], ZOO[name].calls(torch.float32)
    ref = _make(name, "eval")
    model = copy.deepcopy(ref)
    args, kwargs = calls[0]
    with dt.patched(model), torch.no_grad():
        want = _run(ref, calls[0])[0]
        if case.traced is True:
            program = torch.export.export(model, args, kwargs)
            ops = {str(n.target) for n in program.graph.nodes if n.op == "call_function"}
            assert any(op.startswith("dnnctl.") for op in ops), sorted(ops)
            _close(_tensors(program.module()(*args, **kwargs)), want, _TOL[torch.float32],
                   "export")
        if kwargs or any(a is None for a in args):
            return
        traced = torch.jit.trace(model, args, check_trace=False, strict=False)
        kinds = {n.kind() for n in traced.inlined_graph.nodes()}
        assert any(k.startswith("dnnctl::") for k in kinds), sorted(kinds)
        _close(_tensors(traced(*args)), want, _TOL[torch.float32], "jit.trace")
