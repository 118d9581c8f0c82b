"""Weight quantization: the recipe grammar (no heavy imports), numerics, sensitivity, MIL ops."""

from decodebench.contracts.recipes import (
    PRESET_RECIPES,
    QuantRecipe,
    RecipeError,
    Scheme,
    parse_recipe,
)

__all__ = ["PRESET_RECIPES", "QuantRecipe", "RecipeError", "Scheme", "parse_recipe"]
