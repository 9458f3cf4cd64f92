"""The clustered attentions' output together with the clustering it used, for the dense references."""
import torch

from attention_ext import build_attention
from attention_ext.attentions.clustered import cluster_queries


def module_and_clusters(name, q, k, v, lengths, seed, **options):
    """The module's output and the clustering it used (same seed, same draws)."""
    attention = build_attention(name, **options)
    torch.manual_seed(seed)
    out = attention(q, k, v, lengths)
    torch.manual_seed(seed)
    if lengths is None:
        lengths = torch.full((q.shape[0],), q.shape[2], device=q.device)
    clusters = cluster_queries(q, lengths, attention.clusters, attention.bits, attention.iterations)
    return out, clusters
