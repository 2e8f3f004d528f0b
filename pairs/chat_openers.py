"""Seeds for the chat training prompts' conversations (pairs.chat_train_prompts), written for this
project as pairs.chat_seeds is: short question-answer pairs that open a conversation, and follow-ups
that ask for more. No third-party text.
"""

from __future__ import annotations

# (question, short answer) pairs that open a conversation; a follow-up asks for more.
CONVERSATION_OPENERS = (
    (
        "What's a good houseplant for a beginner?",
        "A pothos is hard to kill: it tolerates low light, forgives missed waterings and grows quickly.",
    ),
    (
        "How long should I boil an egg for a runny yolk?",
        "About six minutes in gently boiling water, then straight into cold water to stop the cooking.",
    ),
    (
        "Can you recommend a board game for four adults?",
        "Try Ticket to Ride: the rules take ten minutes to learn and a game lasts about an hour.",
    ),
    (
        "What's the capital of Australia?",
        "Canberra. Many people guess Sydney, but Canberra was chosen as a compromise between Sydney and Melbourne.",
    ),
    (
        "How many cups of water should I drink a day?",
        "A common guide is about eight cups, but needs vary with your size, activity and the weather.",
    ),
    (
        "What should I pack for a weekend hiking trip?",
        "Layers, a rain jacket, sturdy boots, a map, enough water, snacks, a first-aid kit and a head torch.",
    ),
    (
        "Is it better to rent or buy a home?",
        "It depends on how long you'll stay, local prices and your savings; buying pays off mostly over many years.",
    ),
    (
        "How do I get red wine out of a carpet?",
        "Blot, don't rub; then dab with a mix of dish soap, vinegar and warm water, and blot again with clean water.",
    ),
    (
        "What's the difference between baking soda and baking powder?",
        "Baking soda needs an acid in the recipe to react; baking powder already contains its own acid.",
    ),
    (
        "Which is healthier, brown rice or white rice?",
        "Brown rice keeps its bran, so it has more fibre and some more vitamins; white rice is easier to digest.",
    ),
    (
        "How often should I change my car's oil?",
        "Most modern cars need it every 10,000 to 15,000 km, but your owner's manual has the exact interval.",
    ),
    (
        "What's a good first programming language?",
        "Python is a popular choice: its syntax is readable and it is used for everything from websites to data.",
    ),
    (
        "Why do cats purr?",
        "Cats purr when content, but also when stressed or hurt; the vibration may even help them heal.",
    ),
    (
        "How can I fall asleep faster?",
        "Keep a regular bedtime, dim the lights an hour before, avoid screens and caffeine late, and keep the room cool.",
    ),
    (
        "What's a healthy breakfast I can make in five minutes?",
        "Greek yoghurt with oats, berries and a handful of nuts is quick, filling and balanced.",
    ),
    (
        "How do I write a good thank-you note?",
        "Name the gift or favour, say specifically why it mattered to you, and keep it short and warm.",
    ),
    (
        "What's the best way to learn vocabulary in a new language?",
        "Spaced repetition flashcards, a few minutes every day, with words you actually meet in context.",
    ),
    (
        "Should I stretch before or after running?",
        "Do a dynamic warm-up before running, and save longer static stretches for after.",
    ),
    (
        "How do I keep cut flowers fresh longer?",
        "Trim the stems at an angle, change the water every two days and keep the vase away from fruit and heat.",
    ),
    (
        "What is a Roth IRA?",
        "It's a US retirement account funded with taxed money; qualified withdrawals in retirement are tax-free.",
    ),
    (
        "Why is my bread dense?",
        "Usually the dough didn't rise enough: old yeast, a cold kitchen or too little kneading are common causes.",
    ),
    (
        "How do I start running if I've never run before?",
        "Alternate one minute of running with two of walking for twenty minutes, three times a week, and build up.",
    ),
    (
        "What's a good gift for a coworker who is leaving?",
        "A card signed by the team plus something small and personal, like a book or a plant for their new desk.",
    ),
    (
        "How do I clean a cast-iron pan?",
        "Rinse with hot water and a brush, dry it fully on the stove, then rub in a thin layer of oil.",
    ),
    (
        "What are the symptoms of dehydration?",
        "Thirst, dark urine, tiredness, dizziness and headaches are the most common early signs.",
    ),
    (
        "How can I make my presentation less boring?",
        "Open with a story or question, use fewer words per slide, and give the audience one clear takeaway.",
    ),
    (
        "What's the difference between a crocodile and an alligator?",
        "Alligators have a wide U-shaped snout; crocodiles have a narrower V-shaped one and show their lower teeth.",
    ),
    (
        "How much should I tip in a restaurant in the US?",
        "Between 15 and 20 percent of the bill before tax is usual for table service.",
    ),
    ("Can dogs eat grapes?", "No. Grapes and raisins can cause kidney failure in dogs, even in small amounts."),
    (
        "What's a good way to remember people's names?",
        "Repeat the name when you're introduced, use it once in the conversation, and link it to something vivid.",
    ),
    (
        "How do I make cold brew coffee?",
        "Mix coarsely ground coffee with cold water at about one to eight, steep twelve to eighteen hours, then strain.",
    ),
    (
        "What should I do if my laptop gets wet?",
        "Turn it off at once, unplug it, remove what you can, turn it upside down and let it dry for at least two days.",
    ),
    (
        "How do solar eclipses happen?",
        "The Moon passes between the Sun and Earth and casts its shadow on part of Earth's surface.",
    ),
    (
        "Is it safe to eat raw cookie dough?",
        "Not really: raw flour and raw eggs can carry bacteria. Heat-treated flour and no eggs make it safer.",
    ),
    (
        "How can I be more productive in the morning?",
        "Plan the day the night before, start with the hardest task, and leave email until after your first hour.",
    ),
    (
        "What's the best way to store fresh herbs?",
        "Soft herbs like basil go in a glass of water on the counter; hardy ones like thyme wrap in a damp towel in the fridge.",
    ),
    (
        "How do I change a flat tyre?",
        "Loosen the nuts, jack up the car, swap the wheel, hand-tighten the nuts, lower the car and tighten them in a star pattern.",
    ),
    (
        "Why do onions make you cry?",
        "Cutting them releases a gas that forms a mild acid when it meets the water in your eyes.",
    ),
    (
        "What's a good book for someone who likes mysteries?",
        "The Thursday Murder Club by Richard Osman is a light, funny mystery that many readers enjoy.",
    ),
    (
        "How do I politely decline an invitation?",
        "Thank them, say clearly that you can't make it, and if you like, suggest another time to meet.",
    ),
    (
        "How long does it take to digest a meal?",
        "Food leaves the stomach in two to five hours, but full digestion through the gut takes a day or more.",
    ),
    (
        "Why does the moon look bigger near the horizon?",
        "It's an illusion: the moon is the same size, but our brain judges it against trees and buildings.",
    ),
    (
        "What's the quickest way to cool down a hot room?",
        "Close blinds during the day, open windows at night to create a cross-breeze, and put a fan near a window.",
    ),
    (
        "How do I know if an avocado is ripe?",
        "It yields slightly to gentle pressure, and the small stem cap comes off easily showing green underneath.",
    ),
    (
        "What is the Great Barrier Reef?",
        "The world's largest coral reef system, off the coast of Queensland, Australia, visible even from space.",
    ),
    (
        "How do I start a compost bin?",
        "Mix green scraps like vegetable peels with brown material like dry leaves, keep it damp and turn it weekly.",
    ),
    (
        "What is a good age to start a child on piano lessons?",
        "Many teachers suggest around six or seven, when children can focus for a half-hour lesson.",
    ),
    (
        "How can I reduce my electricity bill?",
        "Switch to LED bulbs, unplug idle devices, wash clothes at lower temperatures and use a programmable thermostat.",
    ),
    (
        "Why do we get goosebumps?",
        "Tiny muscles at the base of hairs contract when we're cold or moved, a leftover reflex from furrier ancestors.",
    ),
    (
        "How do I get better at chess?",
        "Solve a few tactics puzzles daily, play longer games, and review your losses to find the moment things went wrong.",
    ),
    (
        "What is jet lag and how do I beat it?",
        "It's your body clock out of step with local time; get daylight at the new destination and shift your sleep gradually.",
    ),
    (
        "Which vegetables grow well in shade?",
        "Leafy greens like lettuce, spinach and kale, plus herbs like parsley and mint, cope with partial shade.",
    ),
    (
        "How can I tell if an email is a scam?",
        "Watch for urgency, odd sender addresses, spelling mistakes and links that don't go where they claim.",
    ),
    (
        "What's the difference between a latte and a cappuccino?",
        "A cappuccino has equal parts espresso, steamed milk and foam; a latte has more milk and only a thin layer of foam.",
    ),
    (
        "How do I fix a squeaky door hinge?",
        "Lift out the hinge pin, wipe it, coat it with a little petroleum jelly or oil, and tap it back in.",
    ),
    (
        "What are good stretches for lower back pain?",
        "Gentle knee-to-chest stretches, cat-cow and child's pose help many people; stop if anything causes sharp pain.",
    ),
    (
        "How do I make a budget?",
        "List your monthly income, then fixed costs, then set limits for everything else and track spending for a month.",
    ),
    (
        "What are the planets in our solar system?",
        "Mercury, Venus, Earth, Mars, Jupiter, Saturn, Uranus and Neptune, in order from the Sun.",
    ),
    (
        "How do I keep my phone battery healthy?",
        "Avoid extreme heat, keep the charge roughly between 20 and 80 percent, and don't leave it at full charge for days.",
    ),
    (
        "How do I teach my dog to sit?",
        "Hold a treat above its nose and move it back; as its bottom goes down, say 'sit' and give the treat at once.",
    ),
)

CONVERSATION_FOLLOW_UPS = (
    "Can you explain that in a bit more detail?",
    "Thanks! Could you give me an example?",
    "What if I only have half the time?",
    "Can you put that as a short numbered list?",
    "Why is that?",
    "Is there anything I should avoid?",
    "How would that change for a child?",
    "Could you say that more simply?",
    "Are there any alternatives?",
    "And what would you do first?",
    "That's helpful. What's a common mistake people make with this?",
    "Can you make it shorter, in one sentence?",
)
